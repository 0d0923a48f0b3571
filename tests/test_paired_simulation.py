"""The paired verdicts' error rates by simulation (kdpipe/evaluation/paired.py;
docs/report.md, "Intervals and verdicts"): experiments made up with a known difference between two methods, each
trained under 3 teacher seeds (and 2, the fewest a verdict over teacher seeds rests on) and 3 student seeds and
scored on 200 test rows, with a teacher-by-method effect, a seed-by-method effect and each row's own chance. The
hierarchical bootstrap must hold its nominal rates there; a bootstrap that ignores the teacher seeds must not.

Every method's accuracy on a row is q_row + μ_method + a_teacher + a_(teacher, method) + b_(teacher, seed)
+ b_(teacher, seed, method), each effect uniform with mean 0 (so no probability leaves [0, 1] and the true
difference is exactly μ_A − μ_B): q_row on [0.35, 0.83], the teacher-by-method effect with standard deviation 0.03,
the seed-by-method effect 0.01, the effects both methods share 0.02 (teacher) and 0.01 (seed, its batch order). Each
row is then right or wrong by a coin of that chance, apart for every model.

Monte Carlo tolerance: a rate measured over R replicates is allowed 3 binomial standard deviations above its nominal
value p, 3·sqrt(p(1 − p)/R) (a false "reproduced" of 2.5% over 800 replicates may read up to 4.2%; any false
decision, 5%, up to 7.3%); the 95% interval's coverage must reach 90%. The rows are drawn 200 times instead of
4,000 (their part of the variance then carries a Monte Carlo error of about 10% of its size, under 5% of the
standard error): enough for rates measured to a point, and the file runs in seconds.
"""

from __future__ import annotations

import numpy as np
import pytest

from kdpipe.evaluation.paired import Accuracy, compare

TEACHERS, SEEDS, ROWS, DRAWS = 3, 3, 200, 200


def _experiments(replicates: int, difference: float, teacher_sd: float = 0.03, seed: int = 0, teachers: int = TEACHERS):
    """Two methods' 0/1 outcomes [replicates, teacher seeds, student seeds, rows], A better by ``difference``."""
    rng = np.random.default_rng(seed)

    def uniform(sd, shape):
        return rng.uniform(-np.sqrt(3) * sd, np.sqrt(3) * sd, shape)

    rows = rng.uniform(0.35, 0.83, (replicates, 1, 1, ROWS))
    shared = uniform(0.02, (replicates, teachers, 1, 1)) + uniform(0.01, (replicates, teachers, SEEDS, 1))
    out = []
    for mu in (difference, 0.0):
        chance = rows + mu + shared
        chance = chance + uniform(teacher_sd, (replicates, teachers, 1, 1)) + uniform(0.01, chance.shape[:3] + (1,))
        assert chance.min() >= 0 and chance.max() <= 1
        out.append((rng.random(chance.shape) < chance).astype(np.float64))
    return out


def _hierarchical(a: np.ndarray, b: np.ndarray, replicate: int):
    """Each run's teacher seed and student seeds as they are: seeds paired across the methods."""
    count = a.shape[0]
    teachers, seeds = np.repeat(np.arange(count), SEEDS), np.tile(np.arange(SEEDS), count)
    units = [Accuracy(m.reshape(-1, ROWS), teachers=teachers, seeds=seeds) for m in (a, b)]
    result = compare(*units, claim="beats", draws=DRAWS, seed=replicate)
    return result.low, result.high, result.verdict, result.se


def _seeds_only(a: np.ndarray, b: np.ndarray, replicate: int):
    """The teacher seeds ignored: all nine runs of a method as student seeds of one teacher."""
    units = [Accuracy(m.reshape(-1, ROWS), seeds=range(TEACHERS * SEEDS)) for m in (a, b)]
    result = compare(*units, claim="beats", draws=DRAWS, seed=replicate)
    return result.low, result.high, result.verdict, result.se


def _one_run(a: np.ndarray, b: np.ndarray, replicate: int):
    """One results folder: teacher seed 0's student seeds and the rows, as compare.py sees a single run."""
    units = [Accuracy(m[0], seeds=range(SEEDS)) for m in (a, b)]
    result = compare(*units, claim="beats", draws=DRAWS, seed=replicate)
    return result.low, result.high, result.verdict, result.se


def _former_percentile(a: np.ndarray, b: np.ndarray, replicate: int):
    """The bootstrap before teacher seeds, on one run: rows drawn (shared), each model's student seeds drawn apart,
    the 2.5th and 97.5th percentiles of A − B."""
    rng = np.random.default_rng(replicate)
    weights = rng.multinomial(ROWS, np.full(ROWS, 1 / ROWS), size=DRAWS) / ROWS
    means = []
    for model in (a[0], b[0]):
        picks = rng.integers(0, SEEDS, size=(DRAWS, SEEDS))
        means.append(np.take_along_axis(weights @ model.T, picks, axis=1).mean(1))
    low, high = np.percentile(means[0] - means[1], [2.5, 97.5])
    verdict = "reproduced" if low > 0 else "not reproduced" if high < 0 else "undecided at this power"
    return low, high, verdict, np.std(means[0] - means[1], ddof=1)


def _rates(method, replicates: int, difference: float, **kwargs) -> dict[str, float]:
    a, b = _experiments(replicates, difference, **kwargs)
    found = [method(a[r], b[r], r) for r in range(replicates)]
    low, high, verdicts, se = (np.array(column) for column in zip(*found))
    estimates = a.mean((1, 2, 3)) - b.mean((1, 2, 3))
    return {
        "coverage": float(np.mean((low <= difference) & (difference <= high))),
        "reproduced": float(np.mean(verdicts == "reproduced")),
        "decided": float(np.mean(verdicts != "undecided at this power")),
        # the standard error (root mean square over the replicates) against the estimate's spread
        "se_ratio": float(np.sqrt(np.mean(se**2)) / np.std(estimates, ddof=1)),
    }


def _tolerance(rate: float, replicates: int) -> float:
    return rate + 3 * np.sqrt(rate * (1 - rate) / replicates)


def test_the_hierarchical_bootstrap_holds_its_rates_under_a_teacher_effect():
    equal = _rates(_hierarchical, 800, 0.0)
    # equal methods: "A beats B" is falsely reproduced at most 2.5% of the time, decided either way at most 5%
    assert equal["reproduced"] <= _tolerance(0.025, 800), equal
    assert equal["decided"] <= _tolerance(0.05, 800), equal
    assert equal["coverage"] >= 0.90, equal
    # the standard error is that of the estimate, not merely wide (the spread's Monte Carlo error: 2.5%)
    assert 0.9 <= equal["se_ratio"] <= 1.15, equal
    unequal = _rates(_hierarchical, 800, 0.03)
    assert unequal["coverage"] >= 0.90, unequal
    assert unequal["decided"] - unequal["reproduced"] <= 0.005, unequal  # (almost) never the wrong way round
    # without a teacher effect the intervals still cover, and are at most a little wide: the teacher seeds' spread,
    # with 2 degrees of freedom, still carries the student seeds' and the rows' noise
    plain = _rates(_hierarchical, 300, 0.03, teacher_sd=0.0)
    assert plain["coverage"] >= 0.90 and plain["se_ratio"] <= 1.25, plain


def test_two_teacher_seeds_hold_the_rates_too():
    # the fewest teacher seeds a verdict over teacher seeds rests on: their spread has one degree of freedom
    equal = _rates(_hierarchical, 800, 0.0, teachers=2)
    assert equal["reproduced"] <= _tolerance(0.025, 800), equal
    assert equal["decided"] <= _tolerance(0.05, 800), equal
    assert equal["coverage"] >= 0.90, equal


@pytest.mark.parametrize("method", [_seeds_only, _one_run, _former_percentile])
def test_a_bootstrap_that_ignores_the_teacher_seeds_is_anti_conservative(method):
    equal = _rates(method, 300, 0.0)
    assert equal["decided"] > _tolerance(0.05, 300), equal  # false verdicts well above 5%
    assert equal["coverage"] < 0.90, equal
