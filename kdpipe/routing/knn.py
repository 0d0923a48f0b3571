"""The ``knn`` router: how close a row is to a teacher's own labelled validation rows in that teacher's feature space
(docs/routing.md, "Routers"; Sun et al., ICML 2022, "Out-of-distribution detection with deep nearest neighbors").

d_k(x) is the cosine distance from x to its ``neighbours``-th nearest validation row of teacher k's own classes (in
its L2-normalised pooled states), turned into a percentile s_k(x) among those rows' own distances so that teachers
compare; the validation rows' scores are cross-fitted over ``folds`` seeded folds, so a row's own label never decides
its score.
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


def _fit(features: torch.Tensor, rows: np.ndarray, k: int) -> tuple[torch.Tensor, np.ndarray]:
    """The reference rows ``rows`` of ``features`` and each one's distance to its k-th nearest other reference row."""
    reference = features[torch.as_tensor(rows, dtype=torch.long)]
    return reference, kth_distance(reference, reference, k, np.arange(len(rows)))


def knn_scores(
    train: np.ndarray, validation: np.ndarray, validation_own: np.ndarray, neighbours: int, *, folds: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """One teacher's scores s_k for the train rows and (cross-fitted over ``folds``) for the validation rows, from its
    pooled states and the mask of the validation rows of its own classes."""
    train_x, val_x = normalise(train), normalise(validation)
    own = np.flatnonzero(np.asarray(validation_own, bool))
    reference, ranks = _fit(val_x, own, neighbours)
    s_train = percentile(kth_distance(train_x, reference, neighbours, None), ranks)
    fold_of = fold_assignment(len(val_x), folds, seed)
    s_val = np.zeros(len(val_x), np.float32)
    for fold in range(folds):
        held = np.flatnonzero(fold_of == fold)
        kept = own[fold_of[own] != fold]
        if len(held) == 0 or len(kept) == 0:
            continue
        reference, ranks = _fit(val_x, kept, neighbours)
        s_val[held] = percentile(kth_distance(val_x[torch.as_tensor(held)], reference, neighbours, None), ranks)
    return s_train, s_val


def fold_assignment(rows: int, folds: int, seed: int) -> np.ndarray:
    """Each row's fold, 0..folds-1, in a seeded random order (the same for every teacher of a route)."""
    fold_of = np.empty(rows, np.int64)
    fold_of[np.random.default_rng(seed).permutation(rows)] = np.arange(rows) % folds
    return fold_of
