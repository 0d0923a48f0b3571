"""Intervals, paired tests and verdicts (kdpipe/evaluation/paired.py) against values worked out by hand."""

import numpy as np
import pytest

from kdpipe.evaluation.paired import Auroc, CalibrationError, compare, compare_gains, interval, point, verdict


def test_identical_models_differ_by_nothing():
    # three seeds that agree row by row: neither the rows nor the seeds can make a difference
    a = np.tile(np.random.default_rng(1).integers(0, 2, size=200), (3, 1))
    result = compare(a, a.copy(), claim="matches", margin=0.01)
    assert (result.difference, result.low, result.high) == (0.0, 0.0, 0.0)
    assert result.p_value == 1.0
    assert result.verdict == "reproduced"


def test_same_model_with_seeds_that_disagree_is_undecided_not_different():
    # the seeds are drawn apart for A and B, so seed-to-seed noise widens the interval around 0 rather than
    # showing a difference
    a = np.random.default_rng(1).integers(0, 2, size=(3, 200))
    result = compare(a, a.copy(), claim="beats")
    assert result.low < 0 < result.high
    assert result.p_value > 0.2
    assert result.verdict == "undecided at this power"


def test_a_right_where_b_is_wrong():
    a, b = np.ones((3, 50)), np.zeros((3, 50))
    result = compare(a, b, claim="beats", gap=0.03)
    assert (result.difference, result.low, result.high, result.p_value) == (1.0, 1.0, 1.0, 0.0)
    assert result.verdict == "reproduced"


def test_difference_is_the_share_of_rows_only_a_gets_right():
    # one seed, 100 rows: A right on 80, B on the same 80 less 5 of them -> A - B = 5/100 exactly
    a = np.zeros(100)
    a[:80] = 1
    b = a.copy()
    b[:5] = 0
    result = compare(a, b)
    assert result.difference == pytest.approx(0.05)
    # the paired interval is that of a 5% rate over 100 rows: binomial sd sqrt(0.05 * 0.95 / 100) = 0.0218
    assert result.low >= 0 and result.high == pytest.approx(0.05 + 1.96 * 0.0218, abs=0.015)
    assert result.detectable == pytest.approx(2.8 * 0.0218, rel=0.15)


def test_a_difference_of_gains_is_worked_out_on_shared_rows():
    # one seed, 100 rows. A right on 80 rows, B on 70 of them (gain 10); C on 60, D on 55 of them (gain 5)
    a, b, c, d = (np.zeros(100) for _ in range(4))
    a[:80], b[:70], c[:60], d[:55] = 1, 1, 1, 1
    result = compare_gains(a, b, c, d, claim="beats")
    assert result.difference == pytest.approx(0.05)
    # per row (A - B) - (C - D) is 1 on rows 70-79, -1 on rows 55-59, else 0: mean 0.05, variance
    # (10 + 5) / 100 - 0.05^2 = 0.1475, so the bootstrap's sd over 100 rows is sqrt(0.1475 / 100) = 0.0384
    assert (result.high - result.low) == pytest.approx(2 * 1.96 * 0.0384, rel=0.12)
    assert result.detectable == pytest.approx(2.8 * 0.0384, rel=0.12)
    assert result.verdict == "undecided at this power"  # 0.05 - 1.96 * 0.0384 < 0
    # the same two models on both sides: every draw's difference of gains is exactly 0
    same = compare_gains(a, b, a.copy(), b.copy(), claim="beats")
    assert (same.difference, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="different numbers of rows"):
        compare_gains(a, b, c, d[:99])


def test_interval_width_matches_the_binomial_one():
    rng = np.random.default_rng(0)
    correct = (rng.random(2000) < 0.8).astype(float)
    mean, low, high = interval(correct, seed=3)
    assert mean == pytest.approx(correct.mean())
    assert high - low == pytest.approx(2 * 1.96 * np.sqrt(0.8 * 0.2 / 2000), rel=0.12)


def test_seeds_that_disagree_widen_the_interval():
    # two seeds on the same 400 rows, one at 70% and one at 90%: the seeds' spread dominates the rows'
    rows = np.arange(400)
    spread = np.stack([(rows % 10 < 7), (rows % 10 < 9)]).astype(float)
    steady = np.stack([(rows % 10 < 8), (rows % 10 < 8)]).astype(float)
    _, low_s, high_s = interval(spread)
    _, low_t, high_t = interval(steady)
    assert high_s - low_s > 2 * (high_t - low_t)


@pytest.mark.parametrize(
    ("low", "high", "claim", "gap", "expected"),
    [
        (0.002, 0.03, "beats", 0.03, "reproduced"),
        (-0.01, 0.02, "beats", 0.03, "not reproduced"),  # the published 3 points are ruled out
        (-0.01, 0.04, "beats", 0.03, "undecided at this power"),
        (-0.03, -0.01, "beats", 0.0, "not reproduced"),
        (-0.01, 0.01, "beats", 0.0, "undecided at this power"),
        (-0.004, 0.008, "matches", 0.0, "reproduced"),
        (-0.03, -0.012, "matches", 0.0, "not reproduced"),
        (-0.02, 0.005, "matches", 0.0, "undecided at this power"),
    ],
)
def test_verdicts(low, high, claim, gap, expected):
    assert verdict(low, high, claim, gap=gap, margin=0.01) == expected


def test_unpaired_inputs_are_refused():
    with pytest.raises(ValueError, match="different numbers of rows"):
        compare(np.ones((2, 10)), np.ones((2, 11)))
    with pytest.raises(ValueError, match="claim must be"):
        verdict(0, 1, "wins")


def test_calibration_error_is_torchmetrics_ece_on_every_row():
    import torch
    from torchmetrics.classification import MulticlassCalibrationError

    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(3) * 0.7, size=(2, 500))
    probs[0, :7] = [1.0, 0.0, 0.0]  # confidence exactly 1: a bin of its own
    labels = rng.integers(0, 3, size=500)
    expected = [
        float(MulticlassCalibrationError(num_classes=3, n_bins=15, norm="l1")(torch.tensor(p), torch.tensor(labels)))
        for p in probs
    ]
    metric = CalibrationError(probs.max(-1), probs.argmax(-1) == labels, bins=15)
    assert point(metric) == pytest.approx(np.mean(expected), abs=1e-6)
    mean, low, high = interval(metric)
    assert low < mean < high


def test_calibration_error_by_hand():
    # 4 rows, 2 bins: [0, 0.5) and [0.5, 1); the row of confidence 1.0 has a bin of its own.
    # bin 2: confidences 0.6, 0.9, right on 1 of them: |1 - 1.5| = 0.5; bin 3 (confidence 1, wrong): 1.0; bin 1:
    # 0.4, wrong: 0.4. ECE = (0.5 + 1.0 + 0.4) / 4
    metric = CalibrationError([0.6, 0.9, 1.0, 0.4], [1, 0, 0, 0], bins=2)
    assert point(metric) == pytest.approx(1.9 / 4)


def test_lower_calibration_error_beats():
    rng = np.random.default_rng(2)
    correct = (rng.random((3, 800)) < 0.8).astype(float)
    calibrated = CalibrationError(np.full((3, 800), 0.8), correct)
    overconfident = CalibrationError(np.full((3, 800), 0.99), correct)
    result = compare(calibrated, overconfident, claim="beats")
    assert result.difference == pytest.approx(point(calibrated) - point(overconfident))
    assert result.difference < -0.15 and result.high < 0
    assert result.verdict == "reproduced"  # lower is better: A - B below 0
    assert compare(overconfident, calibrated, claim="beats").verdict == "not reproduced"


def test_auroc_is_sklearn_auroc_on_every_row():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(5)
    in_scores = np.round(rng.normal(0, 1, size=(2, 300)), 1)  # rounded: ties across the two kinds of rows
    ood_scores = np.round(rng.normal(0.7, 1, size=(2, 120)), 1)
    truth = np.r_[np.zeros(300), np.ones(120)]
    expected = [roc_auc_score(truth, np.r_[i, o]) for i, o in zip(in_scores, ood_scores, strict=True)]
    metric = Auroc(in_scores, ood_scores)
    assert point(metric) == pytest.approx(np.mean(expected))
    # ties count one half: one test row and one OOD row of the same score
    assert point(Auroc([[1.0]], [[1.0]])) == 0.5
    assert point(Auroc([[0.0, 2.0]], [[1.0]])) == 0.5


def test_auroc_comparison_draws_the_test_and_ood_rows_apart():
    rng = np.random.default_rng(6)
    in_scores = rng.normal(0, 1, size=(3, 400))
    separating = Auroc(in_scores, rng.normal(3, 1, size=(3, 200)))
    blind = Auroc(in_scores, rng.normal(0, 1, size=(3, 200)))
    result = compare(separating, blind, claim="beats", gap=0.1)
    assert result.low > 0.3 and result.verdict == "reproduced"
    # one OOD row drawn many times must not leave the test rows' share at zero: each stratum keeps its size
    same = compare(separating, separating, claim="matches", margin=0.01)
    assert (same.difference, same.p_value) == (0.0, 1.0)
    with pytest.raises(ValueError, match="different metrics"):
        compare(separating, np.ones((3, 600)))
    with pytest.raises(ValueError, match="different numbers of rows"):
        compare(separating, Auroc(in_scores[:, :399], rng.normal(0, 1, size=(3, 201))))
