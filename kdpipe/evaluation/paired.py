"""Intervals and paired tests over teacher seeds, student seeds and test rows
(docs/report.md, "Intervals and verdicts").

A model is scored on N test rows by a per-row metric, once per *unit* (a teacher seed, student seed pair): one row of
a [units, N] matrix, read by :class:`Accuracy` (a bare 0/1 matrix stands for it), :class:`CalibrationError` or
:class:`Auroc`. Units may be labelled with their teacher seed (``teachers``) and student seed (``seeds``); unlabelled,
all share one teacher seed and their student seeds pair with no other model's. The bootstrap is hierarchical: the
seed levels in closed form, the rows (or ``clusters`` of rows) drawn, one draw shared by every model compared.

:func:`interval` gives a model's 95% interval; :func:`compare` A − B with its intervals, p-value, reach and the tests
of a claim (``beats``, ``matches``); :func:`compare_gains` the same for (A − B) − (C − D); :func:`family` adjusts
several claims' tests together (Holm). Where lower is better (the calibration error), "A beats B" means A − B < 0.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

ALPHA = 0.05  # the family-wise level of the verdicts
POWER = 0.80  # the power at which the smallest detectable difference and confirmable margin are found
UNDECIDED = "undecided at this power"


@dataclass(frozen=True)
class ClaimTest:
    """One hypothesis test of a claim: its raw p-value and the verdict it gives when decided."""

    name: str  # "direction" (A − B against 0), "size" (against the published gap) or "equivalence" (within ±margin)
    p_value: float
    outcome: str  # "reproduced" or "not reproduced": the side of the null value the estimate lies on


@dataclass(frozen=True)
class Comparison:
    """A − B on the same test rows (fractions, not percent), with the tests of a claim when one is given."""

    difference: float
    low: float  # the 95% interval
    high: float
    low90: float  # the 90% interval (two one-sided tests at 5%: equivalence)
    high90: float
    p_value: float  # two-sided, of A − B = 0
    se: float  # the standard error
    df: float  # its degrees of freedom
    detectable: float  # the smallest difference this design detects with 80% power (two-sided, 5%)
    confirmable: float  # the smallest margin two one-sided tests confirm with 80% power if A − B were 0
    teacher_seeds: int  # the fewest teacher seeds of the models compared
    tests: tuple[ClaimTest, ...] = ()
    verdict: str = ""  # the claim's verdict with its own tests as the family (:func:`family` for several claims)


@dataclass(frozen=True)
class Decision:
    """The verdicts of one claim in a family: each test's Holm-adjusted p and verdict, and the claim's verdict."""

    adjusted: tuple[float, ...]
    verdicts: tuple[str, ...]
    verdict: str


def _as_matrix(values, what: str = "0/1") -> np.ndarray:
    matrix = np.atleast_2d(np.asarray(values, dtype=np.float64))
    if matrix.ndim != 2 or matrix.shape[1] == 0:
        raise ValueError(f"expected a [seeds, rows] matrix of {what}, got shape {np.shape(values)}")
    return matrix


class _Units:
    """The units of a metric's matrices: each row's teacher seed and student seed label."""

    def _label(self, units: int, teachers, seeds) -> None:
        self.teachers = np.array([""] * units if teachers is None else [str(t) for t in teachers])
        self.seeds = None if seeds is None else np.array([str(s) for s in seeds])
        if len(self.teachers) != units or (self.seeds is not None and len(self.seeds) != units):
            raise ValueError(f"{units} units (matrix rows), but {len(self.teachers)} teacher labels and "
                             f"{units if seeds is None else len(self.seeds)} seed labels")  # fmt: skip
        if self.seeds is not None and len(set(zip(self.teachers, self.seeds))) < units:
            raise ValueError("two units with the same teacher seed and student seed")

    @property
    def teacher_seeds(self) -> list[str]:
        return sorted(set(self.teachers))

    def units_of(self, teacher: str) -> np.ndarray:
        """The unit rows of one teacher seed, ordered by student seed (a paired draw maps seed to seed)."""
        rows = np.flatnonzero(self.teachers == teacher)
        return rows if self.seeds is None else rows[np.argsort(self.seeds[rows], kind="stable")]


class Accuracy(_Units):
    """The share of rows each unit gets right, from ``correct`` [units, N] (0/1)."""

    lower_is_better = False

    def __init__(self, correct, *, teachers=None, seeds=None) -> None:
        self.correct = _as_matrix(correct)
        self.strata = (self.correct.shape[1],)
        self._label(len(self.correct), teachers, seeds)

    def per_seed(self, weights: np.ndarray) -> np.ndarray:
        """[draws, units]: each unit's accuracy under each draw's row weights [draws, N]."""
        return weights @ self.correct.T / weights.sum(1, keepdims=True)


class CalibrationError(_Units):
    """The expected calibration error as ``torchmetrics.MulticlassCalibrationError`` computes it (L1, equal-width
    bins of float32 confidences, a confidence of 1 in a bin of its own), from ``confidence`` and ``correct``
    [units, N]. Binned ECE is biased upwards: test the difference of two models' ECE, not its distance from 0."""

    lower_is_better = True

    def __init__(self, confidence, correct, bins: int = 15, *, teachers=None, seeds=None) -> None:
        self.confidence, self.correct = _as_matrix(confidence, "confidences"), _as_matrix(correct)
        if self.confidence.shape != self.correct.shape:
            raise ValueError(f"confidence {self.confidence.shape} and correct {self.correct.shape} differ in shape")
        self.strata, self.bins = (self.correct.shape[1],), bins
        self._label(len(self.correct), teachers, seeds)
        edges = np.linspace(0, 1, bins + 1, dtype=np.float32)
        self._gaps = []  # per unit [N, bins + 1]: each row's (correct - confidence) in its bin's column
        for confidence_s, correct_s in zip(self.confidence, self.correct, strict=True):
            gaps = np.zeros((len(confidence_s), bins + 1))
            gaps[
                np.arange(len(confidence_s)), np.searchsorted(edges, confidence_s.astype(np.float32), side="right") - 1
            ] = correct_s - confidence_s
            self._gaps.append(gaps)

    def per_seed(self, weights: np.ndarray) -> np.ndarray:
        total = weights.sum(1)
        return np.stack([np.abs(weights @ gaps).sum(1) / total for gaps in self._gaps], axis=1)


class Auroc(_Units):
    """The area under the ROC curve of a score (larger = less sure) separating OOD rows from the test rows, from
    ``in_scores`` [units, N_in] and ``ood_scores`` [units, N_ood]; ties count one half. The two kinds of rows are
    drawn apart (two strata)."""

    lower_is_better = False

    def __init__(self, in_scores, ood_scores, *, teachers=None, seeds=None) -> None:
        self.in_scores, self.ood_scores = _as_matrix(in_scores, "scores"), _as_matrix(ood_scores, "scores")
        if len(self.in_scores) != len(self.ood_scores):
            raise ValueError(f"{len(self.in_scores)} seeds of test-row scores, {len(self.ood_scores)} of OOD rows")
        self.strata = (self.in_scores.shape[1], self.ood_scores.shape[1])
        self._label(len(self.in_scores), teachers, seeds)

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


def _unit_shares(model: Metric) -> np.ndarray:
    """Each unit's share of the model's value: teacher seeds alike, and student seeds alike within each."""
    shares = np.zeros(len(model.teachers))
    teachers = model.teacher_seeds
    for teacher in teachers:
        rows = model.units_of(teacher)
        shares[rows] = 1 / (len(teachers) * len(rows))
    return shares


def _values(model: Metric) -> np.ndarray:
    """[units]: each unit's metric on every row."""
    return model.per_seed(np.ones((1, sum(model.strata))))[0]


def point(model) -> float:
    """The metric on every row: the mean over teacher seeds of the mean over each one's student seeds."""
    model = _metric(model)
    return float(_values(model) @ _unit_shares(model))


def _cluster_codes(strata: tuple[int, ...], clusters) -> list[np.ndarray]:
    """Per stratum, each row's cluster as a code 0..C-1 (every row its own cluster without ``clusters``)."""
    if clusters is None:
        return [np.arange(n) for n in strata]
    clusters = np.asarray(clusters)
    if clusters.shape != (sum(strata),):
        raise ValueError(f"{len(clusters)} cluster labels for {sum(strata)} rows")
    bounds = np.cumsum([0, *strata])
    return [np.unique(clusters[a:b], return_inverse=True)[1].ravel() for a, b in zip(bounds, bounds[1:])]


def _row_weights(codes: list[np.ndarray], draws: int, rng: np.random.Generator) -> np.ndarray:
    """[draws, rows] bootstrap weights of the rows: each stratum's clusters drawn with replacement (as many as it
    has), a row weighing as often as its cluster was drawn."""
    parts = []
    for code in codes:
        count = int(code.max()) + 1
        picks = rng.integers(0, count, size=(draws, count)) + count * np.arange(draws)[:, None]
        counts = np.bincount(picks.ravel(), minlength=draws * count).reshape(draws, count)
        parts.append(counts[:, code].astype(np.float64))
    return np.concatenate(parts, axis=1)


def _check(models: list[Metric]) -> tuple[int, ...]:
    kinds = {type(m) for m in models}
    if len(kinds) != 1:
        raise ValueError(f"models scored by different metrics ({sorted(k.__name__ for k in kinds)}): not comparable")
    strata = {m.strata for m in models}
    if len(strata) != 1:
        raise ValueError(f"models evaluated on different numbers of rows ({sorted(strata)}): not paired")
    return strata.pop()


Unit = list[tuple[int, np.ndarray]]  # a top-level unit: (model, its unit rows averaged) for each model it holds


def _top_levels(models: list[Metric]) -> list[list[Unit]]:
    """The top-level units of the models, in groups drawn together: the teacher seeds of models with the same
    several teacher seeds, else the student seeds of models with the same student seed labels, else each model
    alone (docs/report.md, "Intervals and verdicts": pairing)."""
    by_teachers = defaultdict(list)
    for index, model in enumerate(models):
        by_teachers[tuple(model.teacher_seeds)].append(index)
    groups = []
    for teachers, members in by_teachers.items():
        if len(teachers) > 1:
            groups.append([[(i, models[i].units_of(teacher)) for i in members] for teacher in teachers])
            continue
        together = defaultdict(list)
        for i in members:
            rows, seeds = models[i].units_of(teachers[0]), models[i].seeds
            together[("seeds", *seeds[rows]) if seeds is not None else ("model", i)].append((i, rows))
        for items in together.values():
            groups.append([[(i, rows[k : k + 1]) for i, rows in items] for k in range(len(items[0][1]))])
    return groups


def _unit_value(unit: Unit, values: list[np.ndarray], coefficients: Sequence[float]) -> np.ndarray:
    """Σ c_m · (model m's mean over the unit's rows) of per-unit ``values`` (the units on the last axis)."""
    return sum(coefficients[i] * values[i][..., rows].mean(-1) for i, rows in unit)


@dataclass(frozen=True)
class _Estimate:
    value: float
    se: float
    df: float
    teacher_seeds: int


def _estimate(models: list[Metric], coefficients: Sequence[float], draws: int, seed: int, clusters) -> _Estimate:
    """Σ c_m · model_m, its standard error and degrees of freedom (docs/report.md, "Intervals and verdicts": the
    top-level seeds' s²/n, plus the rows' bootstrap variance R less each unit's own row noise W where R − W > 0;
    Welch–Satterthwaite degrees of freedom for the sum)."""
    strata = _check(models)
    codes = _cluster_codes(strata, clusters)
    row_df = float(sum(int(code.max()) for code in codes))  # clusters less one, per stratum
    if row_df < 1:
        raise ValueError("one test row (or one cluster of rows) in each stratum: drawing rows needs at least two")
    weights = _row_weights(codes, draws, np.random.default_rng(seed))
    values = [_values(m) for m in models]
    drawn = [m.per_seed(weights) for m in models]
    shares = [_unit_shares(m) for m in models]
    value = sum(c * v @ w for c, v, w in zip(coefficients, values, shares, strict=True))
    rows = sum(c * d @ w for c, d, w in zip(coefficients, drawn, shares, strict=True))
    tops, noise = [], []  # (variance, degrees of freedom) of each top-level group, and of its units' row noise
    for group in _top_levels(models):
        if len(group) < 2:
            continue
        units = np.array([_unit_value(unit, values, coefficients) for unit in group])
        tops.append((float(units.var(ddof=1)) / len(units), len(units) - 1.0))
        by_draw = np.stack([_unit_value(unit, drawn, coefficients) for unit in group], axis=1)
        spread = float((by_draw - by_draw.mean(1, keepdims=True)).var(0, ddof=1).mean()) / (len(units) - 1)
        noise.append((spread, (len(units) - 1.0) * row_df))
    drawn_rows = float(np.var(rows, ddof=1))
    rows_part = drawn_rows - sum(v for v, _ in noise)
    terms = list(tops)
    if rows_part > 0:
        terms += [(drawn_rows, row_df), *noise]
    variance = sum(v for v, _ in tops) + max(rows_part, 0.0)
    denominator = sum(v**2 / df for v, df in terms if v > 0)
    df = variance**2 / denominator if denominator > 0 else np.inf
    return _Estimate(float(value), float(np.sqrt(variance)), float(df), min(len(m.teacher_seeds) for m in models))


def _quantile(level: float, df: float) -> float:
    return float(special.stdtrit(df, level))


def _above(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (t may be ±inf)."""
    return float(special.stdtr(df, -t))


def _ratio(distance: float, se: float) -> float:
    """distance / se, with 0 / 0 = 0 (no variation and no distance) and ±inf for a distance without variation."""
    if se > 0:
        return distance / se
    return 0.0 if distance == 0 else float(np.sign(distance) * np.inf)


def interval(model, draws: int = 4000, seed: int = 0, clusters=None) -> tuple[float, float, float]:
    """The metric and its 95% interval over teacher seeds, student seeds and rows (or clusters of rows):
    (mean, low, high), the interval within [0, 1]; ``model`` a metric, or a 0/1 matrix for accuracy."""
    model = _metric(model)
    found = _estimate([model], [1.0], draws, seed, clusters)
    half = _quantile(0.975, found.df) * found.se
    return found.value, max(found.value - half, 0.0), min(found.value + half, 1.0)


def compare(
    a,
    b,
    *,
    claim: str | None = None,
    gap: float = 0.0,
    margin: float = 0.01,
    draws: int = 4000,
    seed: int = 0,
    clusters=None,
) -> Comparison:
    """A − B on the same test rows (two metrics of one kind, or two 0/1 matrices for accuracy, rows in the same
    order), with the tests and verdict of ``claim`` (``beats`` by ``gap``, or ``matches`` within ``margin``)."""
    a, b = _metric(a), _metric(b)
    found = _estimate([a, b], [1.0, -1.0], draws, seed, clusters)
    return _comparison(found, a.lower_is_better, claim, gap, margin)


def compare_gains(
    a,
    b,
    c,
    d,
    *,
    claim: str | None = None,
    gap: float = 0.0,
    margin: float = 0.01,
    draws: int = 4000,
    seed: int = 0,
    clusters=None,
) -> Comparison:
    """(A − B) − (C − D): how much larger A's gain over B is than C's over D, all four on the same test rows, one
    draw of the rows shared by the four, their seeds drawn as in :func:`compare`."""
    models = [_metric(m) for m in (a, b, c, d)]
    found = _estimate(models, [1.0, -1.0, -1.0, 1.0], draws, seed, clusters)
    return _comparison(found, models[0].lower_is_better, claim, gap, margin)


def claim_tests(advantage: float, se: float, df: float, claim: str, gap: float = 0.0, margin: float = 0.01):
    """The tests of a claim on the *advantage* of A (A − B, or B − A where lower is better): ``beats`` the direction
    and, with a gap > 0, the size (two-sided); ``matches`` the equivalence within ±``margin`` (two one-sided tests
    inside the margin; outside it, the test that the difference lies beyond it)."""
    if claim == "beats":
        tests = [_two_sided("direction", advantage, 0.0, se, df)]
        if gap > 0:
            tests.append(_two_sided("size", advantage, gap, se, df))
        return tuple(tests)
    if claim == "matches":
        if margin <= 0:
            raise ValueError(f"a margin must be above 0, not {margin}")
        inside = abs(advantage) < margin
        if inside:  # TOST: both one-sided nulls, A − B ≤ −m and A − B ≥ m, rejected
            p = max(_above(_ratio(advantage + margin, se), df), _above(_ratio(margin - advantage, se), df))
        else:  # beyond the margin: the exact size of rejecting |A − B| ≤ m at the observed distance
            p = _above(_ratio(abs(advantage) - margin, se), df) + _above(_ratio(abs(advantage) + margin, se), df)
        return (ClaimTest("equivalence", min(p, 1.0), "reproduced" if inside else "not reproduced"),)
    raise ValueError(f"claim must be 'beats' or 'matches', not {claim!r}")


def _two_sided(name: str, advantage: float, null: float, se: float, df: float) -> ClaimTest:
    ratio = _ratio(advantage - null, se)
    p = min(1.0, 2 * _above(abs(ratio), df)) if ratio != 0 else 1.0
    return ClaimTest(name, p, "reproduced" if advantage > null else "not reproduced")


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values: the i-th smallest of m p-values times (m − i + 1), made non-decreasing in
    that order and capped at 1. A test whose adjusted p is below α is rejected with the family-wise error rate at α."""
    p = np.asarray(p_values, dtype=np.float64)
    order = np.argsort(p, kind="stable")
    adjusted = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    out = np.empty_like(p)
    out[order] = adjusted
    return out


def family(tests: Sequence[Sequence[ClaimTest]], alpha: float = ALPHA) -> list[Decision]:
    """The verdicts of a family of claims, each given by its tests: every test's p adjusted together (Holm), and a
    test decided when its adjusted p is below ``alpha``, its verdict then the side its estimate lies on."""
    flat = [test for claim in tests for test in claim]
    adjusted = holm([test.p_value for test in flat]) if flat else np.zeros(0)
    out, start = [], 0
    for claim in tests:
        mine = adjusted[start : start + len(claim)]
        verdicts = tuple(test.outcome if p < alpha else UNDECIDED for test, p in zip(claim, mine, strict=True))
        # in words: one test's verdict, or "direction …, size …" for a claim with a gap
        verdict = verdicts[0] if len(claim) == 1 else ", ".join(f"{t.name} {v}" for t, v in zip(claim, verdicts))
        out.append(Decision(tuple(float(p) for p in mine), verdicts, verdict))
        start += len(claim)
    return out


def _comparison(found: _Estimate, lower_is_better: bool, claim: str | None, gap: float, margin: float) -> Comparison:
    """The intervals, p-value, the design's reach and the claim's tests and verdict of an estimated difference; where
    lower is better, the claim's tests read B − A."""
    t95, t90, power = _quantile(0.975, found.df), _quantile(0.95, found.df), _quantile(POWER, found.df)
    tost_power = _quantile(1 - (1 - POWER) / 2, found.df)  # TOST at A − B = 0: each side misses (1 − power)/2
    advantage = -found.value if lower_is_better else found.value
    tests = claim_tests(advantage, found.se, found.df, claim, gap, margin) if claim else ()
    return Comparison(
        difference=found.value,
        low=found.value - t95 * found.se,
        high=found.value + t95 * found.se,
        low90=found.value - t90 * found.se,
        high90=found.value + t90 * found.se,
        p_value=_two_sided("", found.value, 0.0, found.se, found.df).p_value,
        se=found.se,
        df=found.df,
        detectable=(t95 + power) * found.se,
        confirmable=(t90 + tost_power) * found.se,
        teacher_seeds=found.teacher_seeds,
        tests=tests,
        verdict=family([tests])[0].verdict if claim else "",
    )
