"""One teacher's signals on a student's training rows when they come from two splits (train, then transfer rows):
each split's signals are read and checked on their own (kdpipe.signals.load), then joined here in the order of the
student's rows. Small signals (tensors, tables, per-row lists) are concatenated; a memory-mapped token-level dump is
wrapped in a :class:`StackedRows` view, so nothing large is copied."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.signals.load import TokenFeature


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
        elif isinstance(value, TokenFeature):  # a token-level dump without padding
            out[name] = TokenFeature.concat(values, where)
        elif name.endswith(("_lengths", "_tokens")):
            out[name] = None if any(v is None for v in values) else np.concatenate([np.asarray(v) for v in values])
        elif hasattr(value, "shape") and len(getattr(value, "shape", ())) >= 2:
            out[name] = StackedRows(values)
        else:  # labels, layer lists: the same in every split
            if any(v != value for v in values[1:]):
                raise KdpipeError(f"{where}: the train and transfer signals differ in {name} ({values}); rerun them")
            out[name] = value
    return out


class StackedRows:
    """Several row-indexed arrays (memory-mapped dumps, or views of them) one after the other, indexed like one
    array: ``view[i, ...]`` reads row i of the stack."""

    def __init__(self, arrays: list):
        self.arrays = arrays
        self.starts = np.cumsum([0, *(a.shape[0] for a in arrays)])
        if any(a.shape[1:] != arrays[0].shape[1:] for a in arrays):
            raise KdpipeError(f"signals of shapes {[a.shape for a in arrays]} cannot be joined row-wise")

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self.starts[-1]), *self.arrays[0].shape[1:])

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, key):
        rows, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        if isinstance(rows, torch.Tensor):
            rows = rows.cpu().numpy()
        index = np.arange(self.shape[0])[rows] if isinstance(rows, slice) else np.asarray(rows)
        if np.ndim(index) == 0:
            part = int(np.searchsorted(self.starts, index, side="right") - 1)
            return self.arrays[part][(int(index - self.starts[part]), *rest)]
        index = np.asarray(index)
        part = np.searchsorted(self.starts, index, side="right") - 1
        out = None
        for k in np.unique(part):
            chosen = np.flatnonzero(part == k)
            values = np.asarray(self.arrays[k][(index[chosen] - self.starts[k], *rest)])
            if out is None:
                out = np.empty((len(index), *values.shape[1:]), values.dtype)
            out[chosen] = values
        return out
