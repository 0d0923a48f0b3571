"""Out-of-distribution detection and selective prediction from per-row uncertainty scores.

See docs/methods.md, "Judging uncertainty". A score is oriented so that larger means "less likely to be known".
:func:`detection` gives AUROC and AUPR from scikit-learn and the FPR at 95% TPR off its ROC curve;
:func:`risk_coverage` the risk–coverage curve and its AURC, written by hand (scikit-learn has none), ties broken by
row order.
"""

from __future__ import annotations

import numpy as np

from kdpipe.core.store import KdpipeError
from kdpipe.evaluation.metrics import uncertainty_split

CURVE_POINTS = 200  # points kept of a ROC or risk–coverage curve in the JSON (enough to draw it)
TPR_TARGET = 0.95


def scores(member_probs: np.ndarray, prefix: str = "") -> dict[str, np.ndarray]:
    """The uncertainty scores of each row from ``member_probs`` [M, N, C], larger = less sure: ``max_prob`` (the
    negated maximum of the mean probability), ``entropy`` (of the mean), and with M > 1 ``expected_entropy`` (the
    aleatoric part) and ``mutual_info`` (the epistemic part), in nats (docs/methods.md §3). ``prefix`` names them
    (``mc_`` for MC-dropout samples)."""
    split = uncertainty_split(member_probs)
    out = {"max_prob": -np.asarray(member_probs, dtype=np.float64).mean(0).max(-1), "entropy": split["total"]}
    if len(member_probs) > 1:
        out |= {"expected_entropy": split["aleatoric"], "mutual_info": split["epistemic"]}
    return {prefix + name: values for name, values in out.items()}


# each score of :func:`scores` as a column of an evaluation's predictions table, and the sign that orients it
SCORE_COLUMNS = {
    "max_prob": ("confidence", -1.0),
    "entropy": ("total", 1.0),
    "expected_entropy": ("aleatoric", 1.0),
    "mutual_info": ("epistemic", 1.0),
}


def score_column(name: str) -> tuple[str, float]:
    """(the predictions table's column, the sign that makes it "larger = less sure") of the score ``name`` of
    :func:`scores`, an ``mc_`` one too; :class:`KdpipeError` for an unknown name."""
    base = name.removeprefix("mc_")
    if base not in SCORE_COLUMNS:
        known = ", ".join(f"{prefix}{score}" for prefix in ("", "mc_") for score in SCORE_COLUMNS)
        raise KdpipeError(f"no uncertainty score {name!r}; the scores are {known}")
    column, sign = SCORE_COLUMNS[base]
    return name[: len(name) - len(base)] + column, sign


def detection(in_scores: np.ndarray, ood_scores: np.ndarray) -> dict:
    """AUROC, AUPR and FPR at 95% TPR of one score separating OOD rows (positives) from in-distribution rows, and
    the ROC curve thinned to at most :data:`CURVE_POINTS` points."""
    from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve

    in_scores, ood_scores = np.asarray(in_scores, np.float64), np.asarray(ood_scores, np.float64)
    if not len(in_scores) or not len(ood_scores):
        raise KdpipeError(
            f"OOD detection needs rows on both sides: {len(in_scores)} in-distribution, {len(ood_scores)} OOD"
        )
    truth = np.r_[np.zeros(len(in_scores)), np.ones(len(ood_scores))]
    values = np.r_[in_scores, ood_scores]
    fpr, tpr, _ = roc_curve(truth, values, drop_intermediate=False)
    return {
        "auroc": float(roc_auc_score(truth, values)),
        "aupr": float(average_precision_score(truth, values)),
        "fpr95": float(fpr[np.searchsorted(tpr, TPR_TARGET - 1e-12)]),
        "roc": {"fpr": _thin(fpr), "tpr": _thin(tpr)},
    }


def risk_coverage(score: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(coverage, risk) at k = 1..N kept rows, the rows kept in order of increasing ``score`` (most sure first)."""
    order = np.argsort(np.asarray(score, np.float64), kind="stable")
    errors = np.cumsum(~np.asarray(correct, bool)[order])
    kept = np.arange(1, len(order) + 1)
    return kept / len(order), errors / kept


def selective(row_scores: dict[str, np.ndarray], correct: np.ndarray, curve_score: str = "max_prob") -> dict:
    """AURC of every score, and the risk–coverage curve of ``curve_score`` thinned to :data:`CURVE_POINTS`."""
    aurc = {name: float(risk_coverage(values, correct)[1].mean()) for name, values in row_scores.items()}
    coverage, risk = risk_coverage(row_scores[curve_score], correct)
    return {"aurc": aurc, "curve": {"score": curve_score, "coverage": _thin(coverage), "risk": _thin(risk)}}


def _thin(values: np.ndarray) -> list[float]:
    """At most :data:`CURVE_POINTS` evenly spaced points of a curve, its first and last included."""
    values = np.asarray(values, np.float64)
    if len(values) > CURVE_POINTS:
        values = values[np.unique(np.linspace(0, len(values) - 1, CURVE_POINTS).round().astype(int))]
    return [round(float(v), 6) for v in values]
