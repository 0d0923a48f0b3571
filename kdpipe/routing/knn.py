"""The ``knn`` router: how close a row is to a teacher's own training rows in that teacher's feature space
(docs/routing.md, "Routers"; Sun et al., ICML 2022, "Out-of-distribution detection with deep nearest neighbors").

For teacher k with pooled last-layer states f_k (L2-normalised), d_k(x) is the cosine distance from x to its
``neighbours``-th nearest row among the train rows of k's own classes, x itself left out. Distances of different
teachers are not comparable, so each becomes a percentile: s_k(x) = share of k's own validation rows whose distance
is at least d_k(x), in [0, 1] (1: closer than any of them). MUKI weighs the scores by softmax(s/τ_s).
"""

from __future__ import annotations

import numpy as np
import torch

CHUNK = 2048  # query rows per distance block: memory is CHUNK × (own train rows) floats


def normalise(features: np.ndarray) -> torch.Tensor:
    x = torch.tensor(np.asarray(features), dtype=torch.float32)  # a copy: the features may be a read-only memmap
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


def kth_distance(queries: torch.Tensor, reference: torch.Tensor, k: int, self_index: np.ndarray | None) -> np.ndarray:
    """Cosine distance from each (normalised) query to its k-th nearest (normalised) reference row; with
    ``self_index`` (per query, its own position in ``reference`` or -1) a query is never its own neighbour."""
    k = max(1, min(k, reference.shape[0] - (1 if self_index is not None else 0)))
    out = np.empty(queries.shape[0], np.float32)
    for start in range(0, queries.shape[0], CHUNK):
        block = 1.0 - queries[start : start + CHUNK] @ reference.T
        if self_index is not None:
            own = torch.as_tensor(self_index[start : start + CHUNK])
            hit = own >= 0
            block[hit.nonzero().squeeze(-1), own[hit]] = torch.inf
        out[start : start + CHUNK] = block.topk(k, dim=-1, largest=False).values[:, -1].numpy()
    return out


def percentile(distances: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Share of ``reference`` distances ≥ each distance (1: closer than every reference row)."""
    ordered = np.sort(reference)
    if len(ordered) == 0:
        return np.zeros(len(distances), np.float32)
    return (1.0 - np.searchsorted(ordered, distances, side="left") / len(ordered)).astype(np.float32)


def knn_scores(
    train: np.ndarray, validation: np.ndarray, train_own: np.ndarray, validation_own: np.ndarray, neighbours: int
) -> tuple[np.ndarray, np.ndarray]:
    """One teacher's scores s_k for the train and validation rows, from its pooled states of both splits and the
    masks of the rows of its own classes."""
    train_x, val_x = normalise(train), normalise(validation)
    own = np.flatnonzero(train_own)
    reference = train_x[torch.as_tensor(own)]
    position = np.full(len(train_x), -1, np.int64)
    position[own] = np.arange(len(own))
    d_train = kth_distance(train_x, reference, neighbours, position)
    d_val = kth_distance(val_x, reference, neighbours, None)
    calibrate_on = d_val[np.asarray(validation_own, bool)]
    return percentile(d_train, calibrate_on), percentile(d_val, calibrate_on)
