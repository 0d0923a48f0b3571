"""Intervals and paired tests over seeds and test rows (docs/report.md, "Intervals and verdicts").

A model of S seeds on N test rows is a 0/1 matrix ``correct`` [S, N]. A bootstrap draws the test rows (one draw
shared by every model compared: the test is *paired*) and each model's own seeds together, each draw one
multinomial weight vector over the rows. :func:`interval` gives a model's 95% interval, :func:`compare` A − B with
its interval, p-value, smallest detectable difference and the verdict on a ``beats`` or ``matches`` claim, and
:func:`compare_gains` the same for a difference of two gains, (A − B) − (C − D).
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


def _as_matrix(correct) -> np.ndarray:
    matrix = np.atleast_2d(np.asarray(correct, dtype=np.float64))
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise ValueError(f"expected a [seeds, rows] matrix of 0/1, got shape {np.shape(correct)}")
    return matrix


def _row_weights(rows: int, draws: int, rng: np.random.Generator) -> np.ndarray:
    """[draws, rows] bootstrap counts of the test rows, each row summing to ``rows``."""
    return rng.multinomial(rows, np.full(rows, 1.0 / rows), size=draws).astype(np.float64)


def _seed_means(per_seed: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """[draws] means over a bootstrap of the seeds of each draw's per-seed accuracies [draws, S]."""
    draws, seeds = per_seed.shape
    if seeds == 1:
        return per_seed[:, 0]
    picks = rng.integers(0, seeds, size=(draws, seeds))
    return np.take_along_axis(per_seed, picks, axis=1).mean(axis=1)


def _bootstrap(matrices: list[np.ndarray], draws: int, seed: int) -> list[np.ndarray]:
    """Each model's bootstrap accuracies [draws] under one shared draw of the test rows."""
    rows = {m.shape[1] for m in matrices}
    if len(rows) != 1:
        raise ValueError(f"models evaluated on different numbers of rows ({sorted(rows)}): not paired")
    n = rows.pop()
    rng = np.random.default_rng(seed)
    weights = _row_weights(n, draws, rng)
    return [_seed_means(weights @ m.T / n, rng) for m in matrices]


def interval(correct, draws: int = 4000, seed: int = 0) -> tuple[float, float, float]:
    """Mean accuracy over seeds and its 95% bootstrap interval: (mean, low, high)."""
    matrix = _as_matrix(correct)
    (boot,) = _bootstrap([matrix], draws, seed)
    low, high = np.percentile(boot, [2.5, 97.5])
    return float(matrix.mean()), float(low), float(high)


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
    """A − B on the same test rows (both [seeds, rows] 0/1 matrices, rows in the same order), with a verdict on
    ``claim`` when one is given."""
    a, b = _as_matrix(a), _as_matrix(b)
    boot_a, boot_b = _bootstrap([a, b], draws, seed)
    return _comparison(boot_a - boot_b, a.mean() - b.mean(), claim, gap, margin)


def compare_gains(
    a, b, c, d, *, claim: str | None = None, gap: float = 0.0, margin: float = 0.01, draws: int = 4000, seed: int = 0
) -> Comparison:
    """(A − B) − (C − D): how much larger A's gain over B is than C's over D, all four on the same test rows (e.g.
    one method's gain with little data against its gain with all of it, every model scored on the same reviews).
    One draw of the rows is shared by the four models, each model's seeds drawn apart, as in :func:`compare`."""
    a, b, c, d = (_as_matrix(m) for m in (a, b, c, d))
    boot_a, boot_b, boot_c, boot_d = _bootstrap([a, b, c, d], draws, seed)
    difference = (a.mean() - b.mean()) - (c.mean() - d.mean())
    return _comparison((boot_a - boot_b) - (boot_c - boot_d), difference, claim, gap, margin)


def _comparison(diff: np.ndarray, difference: float, claim: str | None, gap: float, margin: float) -> Comparison:
    """The interval, p-value, smallest detectable difference and verdict of a difference from its bootstrap draws."""
    low, high = np.percentile(diff, [2.5, 97.5])
    p_value = min(1.0, 2 * min(np.mean(diff <= 0), np.mean(diff >= 0)))
    return Comparison(
        difference=float(difference),
        low=float(low),
        high=float(high),
        p_value=float(p_value),
        detectable=float(Z_POWER * diff.std(ddof=1)),
        verdict=verdict(low, high, claim, gap, margin) if claim else "",
    )
