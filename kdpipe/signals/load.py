"""A student's view of the cached teacher signals: read, checked, as tensors (the large dumps memory-mapped).

The distill stage reads only what its method declares (``signals`` in :mod:`kdpipe.methods.registry`), from one
teacher's folder of the train split; a per-domain student sees the rows of its domain without any copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.io import read_domain, read_features, read_logits, read_mc


def load_signals(
    names: tuple[str, ...], signal_dir: Path, row_ids, device: torch.device, attention_feature: str = "attentions"
) -> dict:
    """The cached signals ``names`` of one teacher on the train split, checked, as tensors on ``device`` (the large
    token-level dumps stay memory-mapped)."""
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
            array, manifest = read_features(signal_dir / SIGNALS[file].files[0], row_ids)
            out.update({name: array, f"{name}_layers": manifest["layers"], f"{name}_lengths": manifest["lengths"]})
            out[f"{name}_tokens"] = manifest.get("token_hashes")
            out.setdefault("labels", manifest["labels"])
    if "domain" in names:
        rep, expertise, manifest = read_domain(signal_dir / SIGNALS["domain"].files[0], row_ids)
        out.update(domain=rep, expertise=torch.tensor(expertise, device=device))
        out.setdefault("labels", manifest["labels"])
    return out


def subset_signals(signals: dict, positions: np.ndarray) -> dict:
    """One teacher's signals restricted to the rows ``positions`` of the split (a per-domain student): tensors and
    tables are indexed, memory-mapped dumps wrapped in a :class:`RowSubset` (nothing is copied)."""
    out = {}
    for name, value in signals.items():
        if isinstance(value, torch.Tensor):
            out[name] = value[torch.as_tensor(positions, device=value.device)]
        elif isinstance(value, pd.DataFrame):
            out[name] = value.iloc[positions].reset_index(drop=True)
        elif isinstance(value, np.ndarray) and value.ndim >= 2:
            out[name] = RowSubset(value, positions)
        elif name.endswith(("_lengths", "_tokens")) and value is not None:
            out[name] = np.asarray(value)[positions].tolist()
        else:
            out[name] = value  # labels, layer lists
    return out


class RowSubset:
    """Rows ``positions`` of a (memory-mapped) array, indexed like the array itself: ``view[i, ...]`` reads
    ``array[positions[i], ...]``."""

    def __init__(self, array: np.ndarray, positions: np.ndarray):
        self.array, self.positions = array, np.asarray(positions)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.positions), *self.array.shape[1:])

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def __getitem__(self, key):
        if isinstance(key, tuple):
            return self.array[(self.positions[key[0]], *key[1:])]
        return self.array[self.positions[key]]
