"""A student's view of the cached teacher signals: read, checked, as tensors (the large dumps memory-mapped).

The distill stage reads what its method declares from a teacher's folder of each split its rows come from (a
per-domain student its domain's rows, a student with transfer rows the train then transfer rows), copying no dump.
:class:`TokenFeature` pads a batch's rows of a dump (docs/design.md, "Feature dumps and their size").
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.io import read_domain, read_features, read_logits, read_mc
from kdpipe.signals.packed import offsets_of, row_counts


def load_signals(
    names: tuple[str, ...], signal_dir: Path, row_ids, device: torch.device, attention_feature: str = "attentions"
) -> dict:
    """The cached signals ``names`` of one teacher on a split, checked, as tensors on ``device`` or memory-mapped."""
    out = {}
    if "logits" in names:
        logits, labels = read_logits(signal_dir / SIGNALS["logits"].files[0], row_ids)
        out.update(logits=torch.tensor(logits, device=device), labels=labels)
    if "mc" in names:
        probs, scores = read_mc(signal_dir / SIGNALS["mc"].files[0], row_ids, out.get("labels"))
        out.update(
            mc=torch.tensor(np.asarray(probs), device=device),
            mc_scores=scores,
            certainty=torch.tensor(scores["certainty"].to_numpy(), device=device),
        )
        out.setdefault("labels", json.loads((signal_dir / SIGNALS["mc"].manifest).read_text())["labels"])
    for name, file in (("hidden", "hidden"), ("attentions", attention_feature)):
        if name in names:
            data, offsets, tokens, manifest = read_features(signal_dir / SIGNALS[file].files[0], row_ids)
            out[name] = TokenFeature(
                file,
                data,
                offsets[:-1],
                tokens["length"],
                manifest["layers"],
                hidden_size=manifest["hidden_size"],
                heads=manifest["heads"],
                token_hashes=tokens["token_hash"],
            )
            out.setdefault("labels", manifest["labels"])
    if "domain" in names:
        rep, expertise, manifest = read_domain(signal_dir / SIGNALS["domain"].files[0], row_ids)
        out.update(domain=rep, expertise=torch.tensor(expertise, device=device))
        out.setdefault("labels", manifest["labels"])
    return out


def subset_signals(signals: dict, positions: np.ndarray) -> dict:
    """One teacher's signals restricted to the rows ``positions`` of the split, no dump copied."""
    out = {}
    for name, value in signals.items():
        if isinstance(value, torch.Tensor):
            out[name] = value[torch.as_tensor(positions, device=value.device)]
        elif isinstance(value, pd.DataFrame):
            out[name] = value.iloc[positions].reset_index(drop=True)
        elif isinstance(value, TokenFeature):
            out[name] = value.subset(positions)
        elif isinstance(value, np.ndarray) and value.ndim >= 2:
            out[name] = RowView([value], positions)
        else:
            out[name] = value  # labels, layer lists
    return out


def join_parts(parts: list[dict], where: str) -> dict:
    """The signals of each split (dicts of the same keys, in the student's row order) as one dict."""
    if len(parts) == 1:
        return parts[0]
    first, out = parts[0], {}
    for name, value in first.items():
        values = [part[name] for part in parts]
        if isinstance(value, torch.Tensor):
            out[name] = torch.cat(values)
        elif isinstance(value, pd.DataFrame):
            out[name] = pd.concat(values, ignore_index=True)
        elif isinstance(value, TokenFeature):
            out[name] = TokenFeature.concat(values, where)
        elif len(getattr(value, "shape", ())) >= 2:
            out[name] = RowView(values)
        else:  # labels, layer lists: the same in every split
            if any(v != value for v in values[1:]):
                raise KdpipeError(f"{where}: the train and transfer signals differ in {name} ({values}); rerun them")
            out[name] = value
    return out


class RowView:
    """Row-indexed arrays (memory-mapped dumps, or views of them) one after the other, indexed like one array
    without a copy: ``view[i, ...]`` reads row ``index[i]`` of the stack (every row, in order, when ``index`` is
    None): a per-domain student's rows of a dump, or one teacher's train then transfer rows (:func:`join_parts`)."""

    def __init__(self, arrays: list, index: np.ndarray | None = None):
        if any(a.shape[1:] != arrays[0].shape[1:] for a in arrays):
            raise KdpipeError(f"signals of shapes {[a.shape for a in arrays]} cannot be joined row-wise")
        self.arrays = arrays
        self.starts = np.cumsum([0, *(a.shape[0] for a in arrays)])
        self.index = np.arange(self.starts[-1]) if index is None else np.asarray(index)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.index), *self.arrays[0].shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, key):
        rows, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        index = self.index[rows.cpu().numpy() if isinstance(rows, torch.Tensor) else rows]
        if len(self.arrays) == 1:
            return self.arrays[0][(index, *rest)]
        part = np.searchsorted(self.starts, index, side="right") - 1
        if np.ndim(index) == 0:
            return self.arrays[part][(int(index - self.starts[part]), *rest)]
        out = None
        for k in np.unique(part):
            chosen = np.flatnonzero(part == k)
            values = np.asarray(self.arrays[k][(index[chosen] - self.starts[k], *rest)])
            if out is None:
                out = np.empty((len(index), *values.shape[1:]), values.dtype)
            out[chosen] = values
        return out


class TokenFeature:
    """A packed token-level dump (:mod:`kdpipe.signals.packed`) as a student reads it: row i's entries start at
    ``starts[i]`` of the array ``arrays[source[i]]`` (one per split) and cover its ``lengths[i]`` tokens;
    :meth:`batch` zero-pads a batch's rows to the batch's width."""

    def __init__(
        self,
        feature: str,
        data: np.ndarray | list[np.ndarray],
        starts: np.ndarray,
        lengths: np.ndarray,
        layers: list[int],
        *,
        hidden_size: int,
        heads: int | None,
        token_hashes: np.ndarray | None = None,
        source: np.ndarray | None = None,
    ):
        self.feature, self.layers = feature, list(layers)
        self.arrays = list(data) if isinstance(data, list) else [data]
        self.starts, self.lengths = np.asarray(starts, dtype=np.int64), np.asarray(lengths, dtype=np.int64)
        self.source = np.zeros(len(self.lengths), dtype=np.int64) if source is None else np.asarray(source)
        self.token_hashes = None if token_hashes is None else np.asarray(token_hashes, dtype=np.int64)
        self.hidden_size = hidden_size
        self.heads = heads if feature == "attentions" else None  # every head kept; None: hidden or a mean over heads

    @classmethod
    def packed(cls, feature: str, data: np.ndarray, lengths: np.ndarray, layers: list[int], **kwargs) -> TokenFeature:
        """The rows of ``lengths`` stored one after the other in ``data`` from its start (a whole dump)."""
        starts = offsets_of(row_counts(feature, lengths, len(layers), kwargs.get("heads")))[:-1]
        return cls(feature, data, starts, lengths, layers, **kwargs)

    @classmethod
    def concat(cls, views: list[TokenFeature], where: str = "token-level dumps") -> TokenFeature:
        """The rows of ``views`` (of the same feature, layers and widths) one after the other, nothing copied."""
        first, same = views[0], ("feature", "layers", "hidden_size", "heads")
        for view in views[1:]:
            if [getattr(view, key) for key in same] != [getattr(first, key) for key in same]:
                raise KdpipeError(
                    f"{where}: {first.feature} of layers {first.layers} and {view.feature} of layers {view.layers} "
                    "cannot be joined; rerun the dumps"
                )
        arrays, sources = [], []
        for view in views:
            sources.append(view.source + len(arrays))
            arrays.extend(view.arrays)
        hashes = [view.token_hashes for view in views]
        return cls(
            first.feature,
            arrays,
            np.concatenate([view.starts for view in views]),
            np.concatenate([view.lengths for view in views]),
            first.layers,
            hidden_size=first.hidden_size,
            heads=first.heads,
            token_hashes=None if any(h is None for h in hashes) else np.concatenate(hashes),
            source=np.concatenate(sources),
        )

    def __len__(self) -> int:
        return len(self.lengths)

    def subset(self, positions: np.ndarray) -> TokenFeature:
        """Rows ``positions`` only, reading the same arrays (nothing is copied)."""
        positions, view = np.asarray(positions), copy.copy(self)
        view.starts, view.lengths, view.source = self.starts[positions], self.lengths[positions], self.source[positions]
        view.token_hashes = None if self.token_hashes is None else self.token_hashes[positions]
        return view

    def rows(self, index: np.ndarray, slot: int, width: int) -> np.ndarray:
        """Layer slot ``slot`` of rows ``index`` as float32, zero-padded (or cut) to ``width`` tokens: hidden states
        [B, width, H], attentions [B, (heads,) width, width]."""
        index = np.asarray(index, dtype=np.int64)
        if self.feature == "hidden":
            out = np.zeros((len(index), width, self.hidden_size), dtype=np.float32)
            for j, i in enumerate(index):
                start, n = int(self.starts[i]), min(int(self.lengths[i]), width)
                out[j, :n] = self.arrays[self.source[i]][start : start + n, slot]
            return out
        inner = (self.heads,) if self.heads else ()
        out = np.zeros((len(index), *inner, width, width), dtype=np.float32)
        for j, i in enumerate(index):
            n = int(self.lengths[i])
            size = int(np.prod(inner, dtype=np.int64)) * n * n
            start = int(self.starts[i]) + slot * size
            m = min(n, width)
            block = self.arrays[self.source[i]][start : start + size].reshape(*inner, n, n)
            out[j, ..., :m, :m] = block[..., :m, :m]
        return out

    def batch(self, index: np.ndarray, slot: int, width: int, device: torch.device) -> torch.Tensor:
        """:meth:`rows` as a tensor on ``device``."""
        return torch.from_numpy(self.rows(index, slot, width)).to(device, non_blocking=True)
