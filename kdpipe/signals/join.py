"""One teacher's signals on a student's training rows when they come from two splits (train, then transfer rows):
each split's signals are read and checked on their own (kdpipe.signals.load), then joined here in the order of the
student's rows. Small signals (tensors, tables, per-row lists) are concatenated; a memory-mapped token-level dump is
wrapped in a :class:`~kdpipe.signals.load.RowView`, so nothing large is copied."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.signals.load import RowView, TokenFeature


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
            out[name] = RowView(values)
        else:  # labels, layer lists: the same in every split
            if any(v != value for v in values[1:]):
                raise KdpipeError(f"{where}: the train and transfer signals differ in {name} ({values}); rerun them")
            out[name] = value
    return out
