"""How well a router sends rows to the teacher that knows them (docs/routing.md, "Diagnostics").

Routing accuracy: the share of rows whose gold class's owner gets the largest score. Target accuracy: the share of
rows whose distillation target under hard routing (the prediction of the teacher with the largest score, in the
student's label order) has its argmax on the gold class. Both overall and per gold class.
"""

from __future__ import annotations

import numpy as np


def routing_accuracy(scores: np.ndarray, owners: np.ndarray, gold: np.ndarray, labels: list[str]) -> dict:
    """{"accuracy": share routed to the owner, "per_class": {label: share}} (ties go to the first teacher)."""
    right = np.asarray(scores).argmax(-1) == owners
    return _shares(right, gold, labels)


def target_accuracy(scores: np.ndarray, predictions: np.ndarray, gold: np.ndarray, labels: list[str]) -> dict:
    """As :func:`routing_accuracy` for the hard-routed target: ``predictions`` [N, K] is each teacher's predicted
    class as a student label index."""
    routed = np.asarray(scores).argmax(-1)
    right = predictions[np.arange(len(routed)), routed] == gold
    return _shares(right, gold, labels)


def _shares(right: np.ndarray, gold: np.ndarray, labels: list[str]) -> dict:
    per_class = {label: float(right[gold == c].mean()) for c, label in enumerate(labels) if (gold == c).any()}
    return {"accuracy": float(right.mean()) if len(right) else float("nan"), "per_class": per_class}


def misrouted(per_class: dict, threshold: float) -> list[str]:
    """The classes routed to their owner less often than ``threshold``, worst first."""
    return [c for c, share in sorted(per_class.items(), key=lambda kv: kv[1]) if share < threshold]
