"""The packed layout of token-level dumps: each row's real tokens only, no padding
(docs/design.md, "Feature dumps and their size").

Shared by the writer and the checked reader, numpy only. A dump of feature f on a split of N rows is ``f.npy``
(float16, the rows one after the other in split order), ``f.offsets.npy`` (int64 [N + 1], where each row starts)
and ``f.tokens.npy`` (each row's ``length`` and ``token_hash``, a CRC-32 of its token ids).
"""

from __future__ import annotations

import numpy as np

LAYOUT = "packed"  # the manifest's ``layout``
TOKENS = np.dtype([("length", "<i8"), ("token_hash", "<i8")])
SIDECARS = ("offsets", "tokens")  # f.offsets.npy, f.tokens.npy beside f.npy


def sidecar(data_name: str, which: str) -> str:
    """``hidden.npy`` -> ``hidden.offsets.npy`` / ``hidden.tokens.npy``."""
    return f"{data_name.split('.')[0]}.{which}.npy"


def item_shape(feature: str, layers: int, hidden_size: int) -> tuple[int, ...]:
    """One entry along the data file's first axis: (L_sel, H) per token (hidden states), a scalar (attentions)."""
    return (layers, hidden_size) if feature == "hidden" else ()


def row_counts(feature: str, lengths: np.ndarray, layers: int, heads: int | None) -> np.ndarray:
    """Entries each row takes: its tokens (hidden), L_sel·heads·len² (attentions) or L_sel·len² (their mean)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if feature == "hidden":
        return lengths.copy()
    return layers * (heads if feature == "attentions" else 1) * lengths * lengths


def offsets_of(counts: np.ndarray) -> np.ndarray:
    """int64 [N + 1]: where each row starts, the total last."""
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def pack_rows(feature: str, values: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """Padded rows [B, L_sel, S, H] (hidden) or [B, L_sel, (heads,) S, S] as stored: each cut to its own length,
    hidden states token-major [len, L_sel, H], attentions flat."""
    out = []
    for row, n in zip(values, np.asarray(lengths, dtype=np.int64)):
        if feature == "hidden":
            out.append(np.ascontiguousarray(row[:, :n].transpose(1, 0, 2)))
        else:
            out.append(np.ascontiguousarray(row[..., :n, :n]).reshape(-1))
    return out
