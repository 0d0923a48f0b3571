"""Classification metrics of predicted class probabilities: accuracy, macro-F1, NLL, ECE, Brier, reliability bins.

Also the uncertainty split of several members (docs/methods.md §3). Accuracy, macro-F1 and ECE come from
torchmetrics, the rest is numpy where torchmetrics has no such metric (docs/design.md, "Design notes"). Macro-F1
averages over the classes among the labels or the predictions, as scikit-learn's ``f1_score(average="macro")``; ECE
and the reliability bins share equal-width bins on the top-class probability.
"""

from __future__ import annotations

import numpy as np

from kdpipe.core.store import KdpipeError
from kdpipe.evaluation.information import entropy, nll

# Rows stored as float16/float32 do not sum to exactly 1; anything further off is logits or a wrong column.
ROW_SUM_TOLERANCE = 1e-2


def classification_metrics(probs: np.ndarray, labels: np.ndarray, label_names: list[str], ece_bins: int = 15) -> dict:
    """Metrics of ``probs`` [N, C] (rows sum to 1) against integer ``labels`` [N] in 0..C-1, as a JSON-able dict.

    Keys: ``n``, ``accuracy``, ``macro_f1``, ``nll``, ``ece``, ``brier``, ``mean_confidence``, ``mean_entropy``
    (nats), ``per_class_accuracy`` ({name: recall, or None for a class without examples}) and ``reliability``
    ({"bin_edges", "count", "confidence", "accuracy"}; confidence/accuracy are None for empty bins).
    """
    import torch  # (here, not above: the report and the uncertainty split start without torch)
    from torchmetrics.classification import MulticlassAccuracy, MulticlassCalibrationError, MulticlassF1Score

    probs, labels = _validated(probs, labels, label_names, ece_bins)
    n_classes = len(label_names)
    probs_t, labels_t = torch.from_numpy(probs), torch.from_numpy(labels)

    accuracy = MulticlassAccuracy(num_classes=n_classes, average="micro")(probs_t, labels_t)
    macro_f1 = MulticlassF1Score(num_classes=n_classes, average="macro")(probs_t, labels_t)
    ece = MulticlassCalibrationError(num_classes=n_classes, n_bins=ece_bins, norm="l1")(probs_t, labels_t)
    recall = MulticlassAccuracy(num_classes=n_classes, average=None)(probs_t, labels_t)
    support = np.bincount(labels, minlength=n_classes)

    onehot = np.eye(n_classes)[labels]
    return {
        "n": int(len(labels)),
        "accuracy": float(accuracy),
        "macro_f1": float(macro_f1),
        "nll": nll(probs, labels),
        "ece": float(ece),
        "brier": float(np.mean(np.sum((probs - onehot) ** 2, axis=1))),
        "mean_confidence": float(np.mean(probs.max(axis=1))),
        "mean_entropy": float(np.mean(entropy(probs))),
        "per_class_accuracy": {
            name: (float(recall[c]) if support[c] > 0 else None) for c, name in enumerate(label_names)
        },
        "reliability": reliability_bins(probs, labels, ece_bins),
    }


def reliability_bins(probs: np.ndarray, labels: np.ndarray, n_bins: int = 15) -> dict:
    """Per-bin count, mean top-class probability and accuracy on ``n_bins`` equal-width confidence bins.

    Bins are [k/M, (k+1)/M) like torchmetrics' ECE. A confidence of exactly 1.0 (common in a float32 softmax
    of a confident model) goes into the last bin, where torchmetrics gives it an extra bin of its own; the ECE
    recomputed from these bins can then be slightly lower than ``ece``.
    """
    confidence = probs.max(axis=1)
    correct = probs.argmax(axis=1) == labels
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    index = np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, n_bins - 1)
    count = np.bincount(index, minlength=n_bins)
    conf_sum = np.bincount(index, weights=confidence, minlength=n_bins)
    correct_sum = np.bincount(index, weights=correct.astype(float), minlength=n_bins)
    return {
        "bin_edges": edges.tolist(),
        "count": count.tolist(),
        "confidence": [float(s / k) if k else None for s, k in zip(conf_sum, count)],
        "accuracy": [float(s / k) if k else None for s, k in zip(correct_sum, count)],
    }


def _validated(
    probs: np.ndarray, labels: np.ndarray, label_names: list[str], ece_bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """``probs`` as float64 [N, C] and ``labels`` as int64 [N], or a KdpipeError saying what does not fit."""
    probs = np.asarray(probs, dtype=np.float64)
    labels = np.asarray(labels)
    n_classes = len(label_names)
    if probs.ndim != 2 or probs.shape[1] != n_classes:
        raise KdpipeError(
            f"probabilities have shape {probs.shape}, expected [N, {n_classes}] for classes {label_names}"
        )
    if labels.ndim != 1 or len(labels) != len(probs):
        raise KdpipeError(f"labels have shape {labels.shape}, expected [{len(probs)}] to match the probabilities")
    if len(labels) == 0:
        raise KdpipeError("no examples: metrics of an empty split are undefined")
    if not np.issubdtype(labels.dtype, np.integer):
        raise KdpipeError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if labels.min() < 0 or labels.max() >= n_classes:
        raise KdpipeError(f"labels must lie in 0..{n_classes - 1}, got {labels.min()}..{labels.max()}")
    row_sums = probs.sum(axis=1)
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(np.abs(row_sums - 1) > ROW_SUM_TOLERANCE):
        raise KdpipeError(
            "probabilities must be finite, non-negative and sum to 1 per row "
            f"(row sums {row_sums.min():.4f}..{row_sums.max():.4f}); were logits passed instead?"
        )
    if ece_bins < 1:
        raise KdpipeError(f"ece_bins must be at least 1, got {ece_bins}")
    return probs, labels.astype(np.int64)


def uncertainty_split(member_probs: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row uncertainty of an ensemble (or a multi-head model) from ``member_probs`` [M, N, C] (docs/methods.md §3,
    "Metrics"): ``total`` = H(mean_m p_m), ``aleatoric`` = mean_m H(p_m) and ``epistemic`` = total − aleatoric
    (the mutual information, clipped at 0 against rounding), all in nats, each of shape [N]. One member
    (M = 1) has epistemic 0."""
    probs = np.asarray(member_probs, dtype=np.float64)
    if probs.ndim != 3 or probs.shape[1] == 0 or probs.shape[2] < 2:
        raise KdpipeError(f"member probabilities have shape {probs.shape}, expected [M, N, C] with N ≥ 1, C ≥ 2")
    row_sums = probs.sum(axis=-1)
    if not np.all(np.isfinite(probs)) or np.any(probs < 0) or np.any(np.abs(row_sums - 1) > ROW_SUM_TOLERANCE):
        raise KdpipeError(
            "member probabilities must be finite, non-negative and sum to 1 per row; were logits passed instead?"
        )
    total = entropy(probs.mean(axis=0))
    aleatoric = entropy(probs).mean(axis=0)
    return {"total": total, "aleatoric": aleatoric, "epistemic": np.clip(total - aleatoric, 0.0, None)}


def uncertainty_summary(member_probs: np.ndarray, bins: int = 30) -> dict:
    """JSON-able means and histograms of :func:`uncertainty_split`: ``members``, ``total``, ``aleatoric``,
    ``epistemic`` (means, nats), ``bin_edges`` (``bins`` equal bins on [0, log C]) and ``hist`` (counts per kind;
    a value above the last edge, from rounding, counts in the last bin)."""
    if bins < 1:
        raise KdpipeError(f"bins must be at least 1, got {bins}")
    split = uncertainty_split(member_probs)
    members, _, classes = np.shape(member_probs)
    edges = np.linspace(0.0, np.log(classes), bins + 1)
    hist = {
        kind: np.histogram(np.clip(values, 0.0, edges[-1]), bins=edges)[0].astype(int).tolist()
        for kind, values in split.items()
    }
    return {
        "members": int(members),
        **{kind: float(values.mean()) for kind, values in split.items()},
        "bin_edges": edges.tolist(),
        "hist": hist,
    }


def total_variation(counts_a, counts_b) -> float:
    """½ Σ |a/Σa − b/Σb| between two histograms over the same bins (0 = same shape, 1 = disjoint)."""
    a, b = np.asarray(counts_a, dtype=np.float64), np.asarray(counts_b, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1 or a.sum() <= 0 or b.sum() <= 0:
        raise KdpipeError(
            f"total variation needs two non-empty histograms over the same bins, got shapes "
            f"{a.shape} and {b.shape} with totals {a.sum()} and {b.sum()}"
        )
    return float(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())
