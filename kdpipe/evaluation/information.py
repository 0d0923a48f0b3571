"""Entropy, normalised entropy and negative log-likelihood of predicted class probabilities, in numpy.

The one implementation of each (docs/methods.md §1.4 and §3, docs/routing.md, "Certainty scores"), on the last axis
and in the dtype of its input (float32 as the MC-dropout signal stores them, float64 as the metrics compute them).
"""

from __future__ import annotations

import math

import numpy as np

# Probabilities are clamped here before taking a log, so one confidently wrong example costs a large but finite
# loss (-log 1e-12 ≈ 27.6 nats) instead of turning the mean into infinity; it also makes 0·log 0 = 0.
PROB_FLOOR = 1e-12


def entropy(probs: np.ndarray) -> np.ndarray:
    """H(p) = −Σ_c p_c log p_c in nats over the last axis, with 0·log 0 = 0 (docs/methods.md §3, "Uncertainty
    split")."""
    probs = np.asarray(probs)
    return -np.sum(probs * np.log(np.clip(probs, PROB_FLOOR, None)), axis=-1)


def normalized_entropy(probs: np.ndarray) -> np.ndarray:
    """H(p) / log C ∈ [0, 1] over the last axis, C the number of classes (docs/methods.md §1.4: MUKI's certainty is
    u = 1 − H(p̄)/log C); 0 for a single class, which leaves nothing to be uncertain about."""
    probs = np.asarray(probs)
    h = entropy(probs)
    classes = probs.shape[-1]
    return h / math.log(classes) if classes > 1 else np.zeros_like(h)


def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    """The mean negative log-likelihood −(1/N) Σ_i log p_i(y_i) of the integer ``labels`` [N] under ``probs``
    [N, C], each probability clamped at :data:`PROB_FLOOR` (docs/design.md, "Design notes": NLL from
    probabilities)."""
    p_true = np.clip(probs[np.arange(len(labels)), labels], PROB_FLOOR, None)
    return float(np.mean(-np.log(p_true)))
