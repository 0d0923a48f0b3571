"""Intervals, paired tests and verdicts (kdpipe/evaluation/paired.py) against values worked out by hand."""

import numpy as np
import pytest
from scipy import stats

from kdpipe.evaluation.paired import (
    Accuracy,
    Auroc,
    CalibrationError,
    ClaimTest,
    claim_tests,
    compare,
    compare_gains,
    family,
    holm,
    interval,
    point,
)


def test_identical_models_differ_by_nothing():
    # three seeds that agree row by row: neither the rows nor the seeds can make a difference
    a = np.tile(np.random.default_rng(1).integers(0, 2, size=200), (3, 1))
    result = compare(a, a.copy(), claim="matches", margin=0.01)
    assert (result.difference, result.low, result.high) == (0.0, 0.0, 0.0)
    assert result.p_value == 1.0
    assert result.verdict == "reproduced"


def test_same_model_with_seeds_that_disagree_is_undecided_not_different():
    # unlabelled seeds are drawn apart for A and B, so seed-to-seed noise widens the interval around 0 rather than
    # showing a difference
    a = np.random.default_rng(1).integers(0, 2, size=(3, 200))
    result = compare(a, a.copy(), claim="beats")
    assert result.low < 0 < result.high
    assert result.p_value > 0.2
    assert result.verdict == "undecided at this power"
    # labelled with the same seeds, they are paired: seed k against seed k, which agree row by row
    paired = compare(Accuracy(a, seeds=[0, 1, 2]), Accuracy(a.copy(), seeds=[0, 1, 2]), claim="matches")
    assert (paired.difference, paired.low, paired.high, paired.p_value) == (0.0, 0.0, 0.0, 1.0)
    assert paired.verdict == "reproduced"
    # other seed numbers are not paired
    apart = compare(Accuracy(a, seeds=[0, 1, 2]), Accuracy(a.copy(), seeds=[3, 4, 5]))
    assert apart.high - apart.low == pytest.approx(result.high - result.low)


def test_a_right_where_b_is_wrong():
    a, b = np.ones((3, 50)), np.zeros((3, 50))
    result = compare(a, b, claim="beats", gap=0.03)
    assert (result.difference, result.low, result.high, result.p_value) == (1.0, 1.0, 1.0, 0.0)
    assert result.verdict == "direction reproduced, size reproduced"


def test_difference_is_the_share_of_rows_only_a_gets_right():
    # one seed, 100 rows: A right on 80, B on the same 80 less 5 of them -> A - B = 5/100 exactly
    a = np.zeros(100)
    a[:80] = 1
    b = a.copy()
    b[:5] = 0
    result = compare(a, b)
    assert result.difference == pytest.approx(0.05)
    # the paired interval is that of a 5% rate over 100 rows: binomial sd sqrt(0.05 * 0.95 / 100) = 0.0218, with
    # Student's t of 99 degrees of freedom (rows less one): 1.984
    assert result.se == pytest.approx(0.0218, rel=0.05) and result.df == pytest.approx(99)
    assert result.low >= 0 and result.high == pytest.approx(0.05 + 1.984 * result.se, rel=1e-4)
    # detectable with 80% power: (t_0.975 + t_0.80) se = (1.984 + 0.845) se; the margin two one-sided tests confirm
    # with 80% power at a true difference of 0: (t_0.95 + t_0.90) se = (1.660 + 1.290) se
    assert result.detectable == pytest.approx(2.829 * result.se, rel=1e-3)
    assert result.confirmable == pytest.approx(2.950 * result.se, rel=1e-3)


def test_a_difference_of_gains_is_worked_out_on_shared_rows():
    # one seed, 100 rows. A right on 80 rows, B on 70 of them (gain 10); C on 60, D on 55 of them (gain 5)
    a, b, c, d = (np.zeros(100) for _ in range(4))
    a[:80], b[:70], c[:60], d[:55] = 1, 1, 1, 1
    result = compare_gains(a, b, c, d, claim="beats")
    assert result.difference == pytest.approx(0.05)
    # per row (A - B) - (C - D) is 1 on rows 70-79, -1 on rows 55-59, else 0: mean 0.05, variance
    # (10 + 5) / 100 - 0.05^2 = 0.1475, so the bootstrap's sd over 100 rows is sqrt(0.1475 / 100) = 0.0384
    assert (result.high - result.low) == pytest.approx(2 * 1.984 * 0.0384, rel=0.12)
    assert result.detectable == pytest.approx(2.83 * 0.0384, rel=0.12)
    assert result.verdict == "undecided at this power"  # 0.05 - 1.98 * 0.0384 < 0
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
    ("advantage", "claim", "gap", "expected"),
    [
        # se 0.01 with infinite degrees of freedom: the normal's quantiles
        (0.025, "beats", 0.0, "reproduced"),  # z = 2.5: p = 0.0124
        (-0.025, "beats", 0.0, "not reproduced"),
        (0.015, "beats", 0.0, "undecided at this power"),  # z = 1.5: p = 0.134
        # direction z = 0.3, size z = -2.7: p 0.764 and 0.0069, Holm-adjusted 0.764 and 0.0139
        (0.003, "beats", 0.03, "direction undecided at this power, size not reproduced"),
        (0.060, "beats", 0.03, "direction reproduced, size reproduced"),  # size z = 3
        (0.040, "beats", 0.03, "direction reproduced, size undecided at this power"),  # size z = 1
        (-0.030, "beats", 0.03, "direction not reproduced, size not reproduced"),
        (0.008, "matches", 0.02, "undecided at this power"),  # 90% interval +0.8 ± 1.64 reaches past +2
        (0.000, "matches", 0.04, "reproduced"),  # TOST: z = 4 on each side
        (0.050, "matches", 0.02, "not reproduced"),  # z = 3 beyond the margin
    ],
)
def test_verdicts(advantage, claim, gap, expected):
    tests = claim_tests(advantage, 0.01, np.inf, claim, gap=gap, margin=gap)
    assert family([tests])[0].verdict == expected


def test_a_direction_without_its_size_never_reads_plain_reproduced():
    # an interval of [+0.1, +0.5] points against a published gap of 3 points: the direction holds, the size is out
    # of reach. se 0.1 points, estimate +0.3: 95% interval +0.3 ± 1.96 * 0.1
    tests = claim_tests(0.003, 0.001, np.inf, "beats", gap=0.03)
    assert [t.name for t in tests] == ["direction", "size"]
    assert tests[0].p_value == pytest.approx(2 * stats.norm.sf(3))
    assert tests[1].p_value == pytest.approx(2 * stats.norm.sf(27))
    assert family([tests])[0].verdict == "direction reproduced, size not reproduced"


def test_equivalence_is_two_one_sided_tests():
    # estimate +0.5 points, se 0.5 points, df 10: t_0.95(10) = 1.812, so the 90% interval is +0.5 ± 0.906
    (tost,) = claim_tests(0.005, 0.005, 10, "matches", margin=0.015)
    # the larger of the two one-sided p: P(T > (1.5 - 0.5) / 0.5 = 2) with 10 df
    assert tost.p_value == pytest.approx(stats.t.sf(2, 10)) and tost.outcome == "reproduced"
    assert family([[tost]])[0].verdict == "reproduced"  # 0.037 < 0.05: +1.41 < 1.5
    (wide,) = claim_tests(0.005, 0.005, 10, "matches", margin=0.013)
    assert wide.p_value == pytest.approx(stats.t.sf(1.6, 10)) and family([[wide]])[0].verdict.startswith("undecided")
    # beyond the margin: the size of rejecting |A - B| <= m where the estimate lies, P(T > 3) + P(T > 5)
    (beyond,) = claim_tests(0.025, 0.005, 10, "matches", margin=0.01)
    assert beyond.p_value == pytest.approx(stats.t.sf(3, 10) + stats.t.sf(7, 10))
    assert beyond.outcome == "not reproduced"


def test_holm_by_hand():
    # p = 0.01, 0.04, 0.03, 0.2: sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1: 0.04, 0.09, 0.08, 0.2, made
    # non-decreasing: 0.04, 0.09, 0.09, 0.2
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    # in a family of three tests the second claim's p = 0.03 is not enough: 0.01 * 3, 0.03 * 2 = 0.06, 0.2 * 1
    first = [ClaimTest("direction", 0.01, "reproduced")]
    second = [ClaimTest("direction", 0.03, "reproduced"), ClaimTest("size", 0.2, "not reproduced")]
    decisions = family([first, second])
    assert decisions[0].verdict == "reproduced" and decisions[0].adjusted == pytest.approx((0.03,))
    assert decisions[1].adjusted == pytest.approx((0.06, 0.2))
    assert decisions[1].verdict == "direction undecided at this power, size undecided at this power"


def test_unpaired_inputs_are_refused():
    with pytest.raises(ValueError, match="different numbers of rows"):
        compare(np.ones((2, 10)), np.ones((2, 11)))
    with pytest.raises(ValueError, match="claim must be"):
        claim_tests(0, 1, np.inf, "wins")
    with pytest.raises(ValueError, match="2 teacher labels"):
        Accuracy(np.ones((3, 10)), teachers=[0, 1])
    with pytest.raises(ValueError, match="same teacher seed and student seed"):
        Accuracy(np.ones((2, 10)), teachers=[0, 0], seeds=[1, 1])
    # one row, or one cluster, is the same in every draw: no interval to give (it would be zero-wide)
    with pytest.raises(ValueError, match="drawing rows needs at least two"):
        compare(np.ones((3, 1)), np.zeros((3, 1)))
    with pytest.raises(ValueError, match="drawing rows needs at least two"):
        interval(np.ones((3, 10)), clusters=["one"] * 10)


def test_the_reports_interval_of_a_model_scored_on_one_row_is_left_blank(tmp_path):
    """The report's accuracy interval (NaN, shown as a dash) where one test row leaves nothing to draw."""
    import pandas as pd

    from kdpipe.report.intervals import accuracy_interval

    for seed in range(2):
        pd.DataFrame({"row_id": [7], "correct": [1]}).to_parquet(tmp_path / f"s{seed}.predictions.parquet")
    assert np.isnan(accuracy_interval([tmp_path / "s0.json", tmp_path / "s1.json"])).all()


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
    assert result.low > 0.3 and result.verdict == "direction reproduced, size reproduced"
    # one OOD row drawn many times must not leave the test rows' share at zero: each stratum keeps its size
    same = compare(separating, separating, claim="matches", margin=0.01)
    assert (same.difference, same.p_value) == (0.0, 1.0)
    with pytest.raises(ValueError, match="different metrics"):
        compare(separating, np.ones((3, 600)))
    with pytest.raises(ValueError, match="different numbers of rows"):
        compare(separating, Auroc(in_scores[:, :399], rng.normal(0, 1, size=(3, 201))))


def _teacher_runs(extra_right: dict[int, range], rows: int = 60, seeds: int = 2) -> np.ndarray:
    """[teacher seeds × student seeds, rows] 0/1: right on the first half of the rows and, under teacher seed t, also
    on the rows ``extra_right[t]``, alike for every student seed."""
    out = []
    for teacher in sorted(extra_right):
        correct = np.zeros(rows)
        correct[: rows // 2] = 1
        correct[list(extra_right[teacher])] = 1
        out += [correct] * seeds
    return np.array(out)


def test_teacher_seeds_are_the_top_level():
    # A - B is +6/60 = 0.10 under teacher seed 0, 0 under seed 1 and +3/60 = 0.05 under seed 2, alike over the two
    # student seeds of each: the teacher seeds' means 0.10, 0.00, 0.05 have variance 0.0025, so the teacher level
    # adds 0.0025 / 3 (se 0.0289) with 2 degrees of freedom, and the rows hardly anything beyond the noise the
    # teacher seeds' spread already holds: the 95% interval is about 0.05 ± 4.303 * 0.0289
    teachers, seeds = [0, 0, 1, 1, 2, 2], [0, 1] * 3
    a = Accuracy(_teacher_runs({0: range(30, 36), 1: range(0), 2: range(36, 39)}), teachers=teachers, seeds=seeds)
    b = Accuracy(_teacher_runs({0: range(0), 1: range(0), 2: range(0)}), teachers=teachers, seeds=seeds)
    result = compare(a, b, claim="beats")
    assert result.difference == pytest.approx(0.05) and result.teacher_seeds == 3
    assert result.se == pytest.approx(np.sqrt(0.0025 / 3), rel=0.02)
    assert result.df == pytest.approx(2, abs=0.1)
    assert result.high - result.low == pytest.approx(2 * 4.303 * np.sqrt(0.0025 / 3), rel=0.05)
    assert result.verdict == "undecided at this power"
    # the same units without their teacher seeds, as six seeds of one teacher, or teacher seed 0 alone, as one run
    # gives it: a narrower interval that misses the teacher seeds' spread
    pooled = compare(Accuracy(a.correct, seeds=range(6)), Accuracy(b.correct, seeds=range(6)))
    one_run = compare(Accuracy(a.correct[:2], seeds=[0, 1]), Accuracy(b.correct[:2], seeds=[0, 1]), claim="beats")
    assert pooled.high - pooled.low < 0.5 * (result.high - result.low)
    assert one_run.difference == pytest.approx(0.10) and one_run.teacher_seeds == 1 and one_run.low > 0
    assert one_run.verdict == "reproduced"
    # a teacher's effect on both models (rows 40-49 right under teacher seed 1 for A and B alike) cancels where the
    # teacher seeds are paired, and widens the interval where they are not
    shared = {0: range(0), 1: range(40, 50), 2: range(0)}
    a2 = Accuracy(_teacher_runs({0: range(30, 36), 1: range(40, 50), 2: range(36, 39)}), teachers=teachers, seeds=seeds)
    b2 = Accuracy(_teacher_runs(shared), teachers=teachers, seeds=seeds)
    assert compare(a2, b2).se == pytest.approx(result.se, rel=0.05)
    apart = Accuracy(b2.correct, teachers=["x", "x", "y", "y", "z", "z"], seeds=seeds)
    assert compare(a2, apart).se > 1.5 * result.se


def test_point_weighs_teacher_seeds_alike():
    # teacher seed 0 with one student seed right everywhere, teacher seed 1 with three wrong everywhere: 0.5
    model = Accuracy(np.r_[np.ones((1, 10)), np.zeros((3, 10))], teachers=[0, 1, 1, 1], seeds=[0, 0, 1, 2])
    assert point(model) == 0.5
    assert interval(np.ones((1, 50))) == (1.0, 1.0, 1.0)
    _, low, high = interval(np.r_[np.ones(49), 0.0])  # 98% of 50 rows: the interval stops at 1
    assert low < 0.98 and high == 1.0


def test_clusters_are_drawn_whole():
    # 100 outcomes, each on a cluster of 4 identical rows: drawn by cluster, the interval is that of the 100
    # outcomes (binomial sd sqrt(0.7 * 0.3 / 100) = 0.0458, 99 degrees of freedom); drawn by row, 400 rows seem
    # independent and the interval is half as wide
    outcomes = (np.arange(100) % 10 < 7).astype(float)
    rows = np.repeat(outcomes, 4)
    clusters = np.repeat([f"question {i}" for i in range(100)], 4)
    by_cluster = compare(rows, np.zeros(400), clusters=clusters)
    by_row = compare(rows, np.zeros(400))
    assert by_cluster.se == pytest.approx(0.0458, rel=0.05) and by_cluster.df == pytest.approx(99)
    assert by_row.se == pytest.approx(0.0458 / 2, rel=0.05) and by_row.df == pytest.approx(399)
    _, low, high = interval(rows, clusters=clusters)
    assert (low, high) == pytest.approx((by_cluster.low, by_cluster.high), abs=0.005)
    # an AUROC's two strata are each drawn by their own clusters
    metric = Auroc(np.repeat(np.arange(50.0), 2)[None], np.arange(10.0)[None] + 20)
    assert compare(metric, metric, clusters=np.r_[np.repeat(np.arange(50), 2), np.arange(10)]).se == 0.0
    with pytest.raises(ValueError, match="3 cluster labels for 400 rows"):
        compare(rows, np.zeros(400), clusters=[1, 2, 3])
