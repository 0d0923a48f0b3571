"""kdpipe.evaluation.metrics against hand-computed values and the conventions its docstring promises."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from kdpipe.core.store import KdpipeError
from kdpipe.evaluation.metrics import classification_metrics, total_variation, uncertainty_split, uncertainty_summary

NAMES = ["a", "b", "c"]

# Four examples, three classes. Predictions (argmax) are [0, 1, 0, 1] against labels [0, 1, 2, 1].
HAND_PROBS = np.array(
    [
        [0.70, 0.20, 0.10],  # label 0: right, confidence 0.70
        [0.10, 0.65, 0.25],  # label 1: right, confidence 0.65
        [0.45, 0.35, 0.20],  # label 2: wrong (predicts 0), confidence 0.45
        [0.05, 0.90, 0.05],  # label 1: right, confidence 0.90
    ]
)
HAND_LABELS = np.array([0, 1, 2, 1])


def test_hand_computed_case():
    m = classification_metrics(HAND_PROBS, HAND_LABELS, NAMES, ece_bins=5)

    assert m["n"] == 4
    # 3 of 4 right.
    assert m["accuracy"] == pytest.approx(0.75)
    # Class a: tp 1, fp 1 (row 2), fn 0 -> P 1/2, R 1, F1 2/3. Class b: tp 2, no errors -> F1 1.
    # Class c: never predicted, one example -> F1 0 (counted). Macro = (2/3 + 1 + 0) / 3 = 5/9.
    assert m["macro_f1"] == pytest.approx(5 / 9)
    # NLL = -(ln 0.70 + ln 0.65 + ln 0.20 + ln 0.90) / 4
    #     = (0.356675 + 0.430783 + 1.609438 + 0.105361) / 4 = 0.625564
    assert m["nll"] == pytest.approx(0.625564, abs=1e-6)
    # Five bins of width 0.2. [0.4, 0.6): row 2, conf 0.45, acc 0 -> gap 0.45.
    # [0.6, 0.8): rows 0 and 1, conf 0.675, acc 1 -> gap 0.325. [0.8, 1]: row 3, conf 0.9, acc 1 -> gap 0.1.
    # ECE = (1 * 0.45 + 2 * 0.325 + 1 * 0.1) / 4 = 0.3
    assert m["ece"] == pytest.approx(0.3)
    # Brier per row: 0.3²+0.2²+0.1² = 0.14; 0.1²+0.35²+0.25² = 0.195; 0.45²+0.35²+0.8² = 0.965;
    # 0.05²+0.1²+0.05² = 0.015. Mean = 1.315 / 4 = 0.32875.
    assert m["brier"] == pytest.approx(0.32875)
    assert m["mean_confidence"] == pytest.approx((0.70 + 0.65 + 0.45 + 0.90) / 4)
    row_entropy = [-sum(p * math.log(p) for p in row) for row in HAND_PROBS]
    assert m["mean_entropy"] == pytest.approx(np.mean(row_entropy))
    assert m["per_class_accuracy"] == {"a": pytest.approx(1.0), "b": pytest.approx(1.0), "c": pytest.approx(0.0)}

    rel = m["reliability"]
    assert rel["bin_edges"] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert rel["count"] == [0, 0, 1, 2, 1]
    assert rel["confidence"] == [None, None, pytest.approx(0.45), pytest.approx(0.675), pytest.approx(0.9)]
    assert rel["accuracy"] == [None, None, 0.0, 1.0, 1.0]


def test_default_bins_and_json_types():
    m = classification_metrics(HAND_PROBS, HAND_LABELS, NAMES)
    assert len(m["reliability"]["bin_edges"]) == 16
    assert len(m["reliability"]["count"]) == 15
    assert all(type(m[key]) is float for key in ("accuracy", "macro_f1", "nll", "ece", "brier"))


def test_perfect_predictions():
    labels = np.array([0, 1, 2, 2, 1])
    m = classification_metrics(np.eye(3)[labels], labels, NAMES)
    assert m["accuracy"] == 1.0
    assert m["macro_f1"] == pytest.approx(1.0)
    assert m["nll"] == pytest.approx(0.0, abs=1e-9)
    assert m["brier"] == pytest.approx(0.0)
    assert m["ece"] == pytest.approx(0.0)
    assert m["mean_entropy"] == pytest.approx(0.0)
    # A confidence of exactly 1.0 lands in the last bin, not outside the diagram.
    assert m["reliability"]["count"][-1] == 5


def test_class_without_examples():
    # Class c has no example and is never predicted: its recall is undefined, and it does not drag macro-F1 down.
    probs = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1]])
    m = classification_metrics(probs, np.array([0, 1]), NAMES)
    assert m["per_class_accuracy"] == {"a": 1.0, "b": 1.0, "c": None}
    assert m["macro_f1"] == pytest.approx(1.0)


def test_class_predicted_without_examples_counts_as_zero_f1():
    # Class c is predicted once but has no example: precision 0 -> F1 0, which counts in the average.
    probs = np.array([[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.1, 0.1, 0.8]])
    m = classification_metrics(probs, np.array([0, 1, 1]), NAMES)
    # a: F1 1. b: tp 1, fn 1 -> P 1, R 1/2, F1 2/3. c: 0. Macro = (1 + 2/3 + 0) / 3.
    assert m["macro_f1"] == pytest.approx(5 / 9)
    assert m["per_class_accuracy"]["c"] is None


def test_ece_matches_its_reliability_bins():
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=2.0, size=(500, 4))
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = rng.integers(0, 4, size=500)
    m = classification_metrics(probs, labels, list("wxyz"))
    rel = m["reliability"]
    gaps = [k * abs(a - c) for k, a, c in zip(rel["count"], rel["accuracy"], rel["confidence"]) if k]
    assert sum(rel["count"]) == 500
    assert m["ece"] == pytest.approx(sum(gaps) / 500, abs=1e-5)


@pytest.mark.parametrize(
    ("probs", "labels", "message"),
    [
        (np.full(3, 1 / 3), np.array([0]), "shape"),
        (np.full((2, 2), 0.5), np.array([0, 1]), "shape"),
        (np.full((2, 3), 1 / 3), np.array([0, 1, 2]), "labels have shape"),
        (np.full((2, 3), 1 / 3), np.array([[0], [1]]), "labels have shape"),
        (np.full((2, 3), 1 / 3), np.array([0, 3]), "0..2"),
        (np.full((2, 3), 1 / 3), np.array([0.0, 1.0]), "integer"),
        (np.array([[2.0, -1.0, 0.5], [0.1, 0.2, 0.3]]), np.array([0, 1]), "logits"),
        (np.zeros((0, 3)), np.zeros(0, dtype=int), "no examples"),
    ],
)
def test_invalid_input_raises(probs, labels, message):
    with pytest.raises(KdpipeError, match=message):
        classification_metrics(probs, labels, NAMES)


# ---- ensemble uncertainty (docs/methods.md §3) ----------------------------------------------------------

LN2 = math.log(2)
# H(¾, ¼) = −(¾ ln ¾ + ¼ ln ¼) = 0.562335
H_3_1 = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
# two members over three rows: disagreeing one-hots, agreeing uniforms, (½,½) vs (1,0)
MEMBERS = np.array([[[1.0, 0.0], [0.5, 0.5], [0.5, 0.5]], [[0.0, 1.0], [0.5, 0.5], [1.0, 0.0]]])


def test_uncertainty_split_by_hand():
    split = uncertainty_split(MEMBERS)
    assert pytest.approx(0.562335, abs=1e-6) == H_3_1
    # row 0: mean (½,½) -> total ln 2, members certain -> aleatoric 0, epistemic ln 2
    # row 1: all uniform -> total = aleatoric = ln 2, epistemic 0
    # row 2: mean (¾,¼) -> total H(¾,¼); aleatoric (ln 2 + 0)/2; epistemic the difference, 0.215762
    assert split["total"] == pytest.approx([LN2, LN2, H_3_1])
    assert split["aleatoric"] == pytest.approx([0.0, LN2, LN2 / 2])
    assert split["epistemic"] == pytest.approx([LN2, 0.0, H_3_1 - LN2 / 2], abs=1e-12)
    assert pytest.approx(0.215762, abs=1e-6) == H_3_1 - LN2 / 2


def test_single_member_has_no_epistemic_uncertainty():
    probs = np.array([[[0.5, 0.5], [0.9, 0.1], [1.0, 0.0]]])
    split = uncertainty_split(probs)
    assert split["epistemic"].tolist() == [0.0, 0.0, 0.0]
    assert split["total"] == pytest.approx(split["aleatoric"])
    assert split["total"][2] == 0.0


def test_uncertainty_summary_means_and_histograms():
    summary = uncertainty_summary(MEMBERS, bins=3)
    json.dumps(summary)  # JSON-able
    assert summary["members"] == 2
    assert summary["total"] == pytest.approx((2 * LN2 + H_3_1) / 3)
    assert summary["aleatoric"] == pytest.approx((LN2 + LN2 / 2) / 3)
    assert summary["epistemic"] == pytest.approx((LN2 + H_3_1 - LN2 / 2) / 3)
    # three bins on [0, ln 2]: [0, 0.231), [0.231, 0.462), [0.462, 0.693]; ln 2 itself is in the last bin
    assert summary["bin_edges"] == pytest.approx([0.0, LN2 / 3, 2 * LN2 / 3, LN2])
    assert summary["hist"] == {"total": [0, 0, 3], "aleatoric": [1, 1, 1], "epistemic": [2, 0, 1]}
    assert all(type(c) is int for counts in summary["hist"].values() for c in counts)
    assert len(uncertainty_summary(MEMBERS)["bin_edges"]) == 31


def test_total_variation_by_hand():
    # (½, ½, 0) vs (0, ½, ½): ½ (½ + 0 + ½) = ½
    assert total_variation([1, 1, 0], [0, 3, 3]) == pytest.approx(0.5)
    assert total_variation([2, 4], [1, 2]) == 0.0
    assert total_variation([1, 0], [0, 5]) == 1.0
    with pytest.raises(KdpipeError, match="same bins"):
        total_variation([1, 2], [1, 2, 3])
    with pytest.raises(KdpipeError, match="non-empty"):
        total_variation([0, 0], [1, 2])


def test_uncertainty_split_refuses_bad_input():
    with pytest.raises(KdpipeError, match="shape"):
        uncertainty_split(np.full((2, 2), 0.5))
    with pytest.raises(KdpipeError, match="logits"):
        uncertainty_split(np.array([[[2.0, -1.0]]]))
    with pytest.raises(KdpipeError, match="bins"):
        uncertainty_summary(MEMBERS, bins=0)


def test_fewer_than_one_ece_bin_is_refused_in_one_line():
    """The evaluate job checks ece_bins itself: a job run by hand has no schema check before it."""
    with pytest.raises(KdpipeError, match=r"^ece_bins must be at least 1, got 0$"):
        classification_metrics(np.array([[0.5, 0.5]]), np.array([0]), ["a", "b"], ece_bins=0)
