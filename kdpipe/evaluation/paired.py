"""Intervals and paired tests over seeds and test rows (docs/report.md, "Intervals and verdicts").

A model of S seeds is scored on N test rows by a per-row metric: accuracy from a 0/1 matrix ``correct`` [S, N]
(a bare matrix stands for it), the expected calibration error from each row's confidence and correctness
(:class:`CalibrationError`), or how well an uncertainty score tells OOD rows from the test rows (:class:`Auroc`). A
bootstrap draws the rows (one draw shared by every model compared: the test is *paired*; the test and the OOD rows
each drawn apart, as two strata) and each model's own seeds together, each draw one multinomial weight vector over
the rows. :func:`interval` gives a model's 95% interval, :func:`compare` A − B with its interval, p-value, smallest
detectable difference and the verdict on a ``beats`` or ``matches`` claim, and :func:`compare_gains` the same for a
difference of two gains, (A − B) − (C − D). Where lower is better (the calibration error), "A beats B" means A − B
is below 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

Z_POWER = 2.8  # z_{0.975} + z_{0.80}: a difference this many standard errors away is detected 80% of the time


@dataclass(frozen=True)
class Comparison:
    """A − B on the same test rows (fractions, not percent)."""

    difference: float
    low: float
    high: float
    p_value: float
    detectable: float  # the smallest difference this design detects with 80% power
    verdict: str  # reproduced | not reproduced | undecided at this power (or "" without a claim)


def _as_matrix(values, what: str = "0/1") -> np.ndarray:
    matrix = np.atleast_2d(np.asarray(values, dtype=np.float64))
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise ValueError(f"expected a [seeds, rows] matrix of {what}, got shape {np.shape(values)}")
    return matrix


class Accuracy:
    """The share of rows each seed gets right, from ``correct`` [S, N] (0/1)."""

    lower_is_better = False

    def __init__(self, correct) -> None:
        self.correct = _as_matrix(correct)
        self.strata = (self.correct.shape[1],)

    def per_seed(self, weights: np.ndarray) -> np.ndarray:
        """[draws, S]: each seed's accuracy under each draw's row weights [draws, N]."""
        return weights @ self.correct.T / self.strata[0]


class CalibrationError:
    """The expected calibration error (L1, equal-width confidence bins, as
    ``torchmetrics.MulticlassCalibrationError``): per bin the gap between the mean confidence and the accuracy,
    weighted by the bin's share of rows, from ``confidence`` and ``correct`` [S, N]. The confidences are binned in
    float32 and a row of confidence 1 has a bin of its own, both as in torchmetrics. Binned ECE is biased upwards
    (a calibrated model on a finite sample scores above 0), so its interval says how much it moves between samples,
    not how far it is from 0; the difference of two models' ECE on the same rows is the quantity to test."""

    lower_is_better = True

    def __init__(self, confidence, correct, bins: int = 15) -> None:
        self.confidence, self.correct = _as_matrix(confidence, "confidences"), _as_matrix(correct)
        if self.confidence.shape != self.correct.shape:
            raise ValueError(f"confidence {self.confidence.shape} and correct {self.correct.shape} differ in shape")
        self.strata, self.bins = (self.correct.shape[1],), bins
        edges = np.linspace(0, 1, bins + 1, dtype=np.float32)
        self._gaps = []  # per seed [N, bins + 1]: each row's (correct - confidence) in its bin's column
        for confidence_s, correct_s in zip(self.confidence, self.correct, strict=True):
            gaps = np.zeros((len(confidence_s), bins + 1))
            gaps[
                np.arange(len(confidence_s)), np.searchsorted(edges, confidence_s.astype(np.float32), side="right") - 1
            ] = correct_s - confidence_s
            self._gaps.append(gaps)

    def per_seed(self, weights: np.ndarray) -> np.ndarray:
        return np.stack([np.abs(weights @ gaps).sum(1) for gaps in self._gaps], axis=1) / self.strata[0]


class Auroc:
    """The area under the ROC curve of a score (larger = less sure) separating OOD rows from the test rows, from
    ``in_scores`` [S, N_in] and ``ood_scores`` [S, N_ood]; ties count one half. The two kinds of rows are drawn apart
    (two strata)."""

    lower_is_better = False

    def __init__(self, in_scores, ood_scores) -> None:
        self.in_scores, self.ood_scores = _as_matrix(in_scores, "scores"), _as_matrix(ood_scores, "scores")
        if len(self.in_scores) != len(self.ood_scores):
            raise ValueError(f"{len(self.in_scores)} seeds of test-row scores, {len(self.ood_scores)} of OOD rows")
        self.strata = (self.in_scores.shape[1], self.ood_scores.shape[1])

    def per_seed(self, weights: np.ndarray) -> np.ndarray:
        n_in, n_ood = self.strata
        w_in, w_ood = weights[:, :n_in], weights[:, n_in:]
        out = []
        for in_s, ood_s in zip(self.in_scores, self.ood_scores, strict=True):
            order = np.argsort(in_s, kind="stable")
            ranked = in_s[order]
            # cumulative weight of the test rows below each position of the sorted scores
            below = np.concatenate([np.zeros((len(weights), 1)), np.cumsum(w_in[:, order], axis=1)], axis=1)
            less = below[:, np.searchsorted(ranked, ood_s, side="left")]
            tied = below[:, np.searchsorted(ranked, ood_s, side="right")] - less
            out.append(((less + 0.5 * tied) * w_ood).sum(1) / (w_in.sum(1) * w_ood.sum(1)))
        return np.stack(out, axis=1)


Metric = Accuracy | CalibrationError | Auroc


def _metric(model) -> Metric:
    return model if isinstance(model, Accuracy | CalibrationError | Auroc) else Accuracy(model)


def point(model) -> float:
    """The metric's value on every row, mean over seeds."""
    model = _metric(model)
    return float(model.per_seed(np.ones((1, sum(model.strata))))[0].mean())


def _row_weights(strata: tuple[int, ...], draws: int, rng: np.random.Generator) -> np.ndarray:
    """[draws, rows] bootstrap counts of the rows, each stratum drawn on its own (its counts sum to its size)."""
    return np.concatenate(
        [rng.multinomial(n, np.full(n, 1.0 / n), size=draws).astype(np.float64) for n in strata], axis=1
    )


def _seed_means(per_seed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[draws] means over a bootstrap of the seeds of each draw's per-seed values [draws, S]."""
    draws, seeds = per_seed.shape
    if seeds == 1:
        return per_seed[:, 0]
    picks = rng.integers(0, seeds, size=(draws, seeds))
    return np.take_along_axis(per_seed, picks, axis=1).mean(axis=1)


def _bootstrap(models: list[Metric], draws: int, seed: int) -> list[np.ndarray]:
    """Each model's bootstrap values [draws] under one shared draw of the rows."""
    kinds = {type(m) for m in models}
    if len(kinds) != 1:
        raise ValueError(f"models scored by different metrics ({sorted(k.__name__ for k in kinds)}): not comparable")
    strata = {m.strata for m in models}
    if len(strata) != 1:
        raise ValueError(f"models evaluated on different numbers of rows ({sorted(strata)}): not paired")
    rng = np.random.default_rng(seed)
    weights = _row_weights(strata.pop(), draws, rng)
    return [_seed_means(m.per_seed(weights), rng) for m in models]


def interval(model, draws: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """The metric over seeds and its 95% bootstrap interval: (mean, low, high); ``model`` a metric, or a 0/1
    matrix for accuracy."""
    model = _metric(model)
    (boot,) = _bootstrap([model], draws, seed)
    low, high = np.percentile(boot, [2.5, 97.5])
    return point(model), float(low), float(high)


def verdict(low: float, high: float, claim: str, gap: float = 0.0, margin: float = 0.01) -> str:
    """The verdict on ``claim`` (``beats`` or ``matches``) from a 95% interval of A − B (see the module's table)."""
    if claim == "beats":
        if low > 0:
            return "reproduced"
        if high < max(gap, 0.0):
            return "not reproduced"
        return "undecided at this power"
    if claim == "matches":
        if -margin < low and high < margin:
            return "reproduced"
        if high < -margin or low > margin:
            return "not reproduced"
        return "undecided at this power"
    raise ValueError(f"claim must be 'beats' or 'matches', not {claim!r}")


def compare(
    a, b, *, claim: str | None = None, gap: float = 0.0, margin: float = 0.01, draws: int = 4000, seed: int = 0
) -> Comparison:
    """A − B on the same test rows (two metrics of one kind, or two 0/1 matrices for accuracy, rows in the same
    order), with a verdict on ``claim`` when one is given."""
    a, b = _metric(a), _metric(b)
    boot_a, boot_b = _bootstrap([a, b], draws, seed)
    return _comparison(boot_a - boot_b, point(a) - point(b), a.lower_is_better, claim, gap, margin)


def compare_gains(
    a, b, c, d, *, claim: str | None = None, gap: float = 0.0, margin: float = 0.01, draws: int = 4000, seed: int = 0
) -> Comparison:
    """(A − B) − (C − D): how much larger A's gain over B is than C's over D, all four on the same test rows (e.g.
    one method's gain with little data against its gain with all of it, every model scored on the same reviews).
    One draw of the rows is shared by the four models, each model's seeds drawn apart, as in :func:`compare`."""
    a, b, c, d = (_metric(m) for m in (a, b, c, d))
    boot_a, boot_b, boot_c, boot_d = _bootstrap([a, b, c, d], draws, seed)
    difference = (point(a) - point(b)) - (point(c) - point(d))
    return _comparison((boot_a - boot_b) - (boot_c - boot_d), difference, a.lower_is_better, claim, gap, margin)


def _comparison(
    diff: np.ndarray, difference: float, lower_is_better: bool, claim: str | None, gap: float, margin: float
) -> Comparison:
    """The interval, p-value, smallest detectable difference and verdict of a difference from its bootstrap draws;
    where lower is better, the verdict reads the interval of B − A."""
    low, high = np.percentile(diff, [2.5, 97.5])
    p_value = min(1.0, 2 * min(np.mean(diff <= 0), np.mean(diff >= 0)))
    ahead = (-high, -low) if lower_is_better else (low, high)
    return Comparison(
        difference=float(difference),
        low=float(low),
        high=float(high),
        p_value=float(p_value),
        detectable=float(Z_POWER * diff.std(ddof=1)),
        verdict=verdict(*ahead, claim, gap, margin) if claim else "",
    )
