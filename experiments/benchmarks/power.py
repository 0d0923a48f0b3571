"""What design would decide a claim: the smallest difference a run of more teacher seeds (or test rows) detects,
projected from the variance parts of a finished run, as the benchmark write-ups state it for undecided claims.

    .venv/bin/python experiments/benchmarks/power.py --results runs/x/t0/results runs/x/t1/results \\
        runs/x/t2/results --models kd_all dd_margin_10 --claim "dd_margin_10 beats kd_all" \\
        --teacher-seeds 3 5 10 20 --rows-factor 1 2

It reads what compare.py reads (the same options for the runs, the models and the claims; accuracy only) and, for
each claim of the form ``A beats B [by g]`` or ``A matches B within m``, splits the squared standard error of A − B
that compare.py computes (docs/report.md, "Intervals and verdicts") into

- the top level's part, s²/n: the spread of A − B over the top-level units (the teacher seeds when there are several,
  each one's mean over its student seeds; else the student seeds) over their number n; it holds the teachers' and
  the students' variance and each unit's own row noise;
- the rows' part: the rest, what drawing other test rows adds on top (with ``--cluster-column``, other clusters of
  rows: a design's rows factor then multiplies the clusters).

A design of T teacher seeds (student seeds as in the run: each unit averages as many) and f times the test rows has
the standard error ``sqrt(s²/T + rows / f)``, Student's t with Welch-Satterthwaite's degrees of freedom (T − 1 for
the top level, the rows less one for the rows' part), so it detects with 80% power at the 5% level (two-sided) a
difference of ``(t(0.975) + t(0.80)) · se``, and confirms a match (two one-sided tests at 5%) 80% of the time, were
A − B zero, within a margin of ``(t(0.95) + t(0.90)) · se``. The unit's own row noise is kept in the top level's
part, so more test rows shrink the standard error less than they would shrink the run's. And as the rows' part
shrinks, the degrees of freedom fall towards the top level's T − 1: with two or three units, t can grow faster than the
standard error falls, so more rows can raise what compare.py's test would detect. Such a line says so ("more rows
lower the degrees of freedom"); the design that decides the claim then needs more units, not more rows. With one
teacher seed the top level is the student seeds, and the teacher seeds' own variance is unknown: the projection then
says what more student seeds would do, and a design over teacher seeds needs a run of several first.

Each claim's line gives the run's standard error and its parts, then, per design, the detectable difference (for a
match: the confirmable margin) and whether it reaches the claim's own target (the gap g of ``beats by g``; the margin
m of a match; for a plain ``beats``, ``--target`` points, else the observed |A − B|).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import numpy as np
from scipy import special

from kdpipe.evaluation.paired import Accuracy, compare

HERE = Path(__file__).resolve().parent


def _compare_script():
    """compare.py as a module: its readers of runs, models and claims."""
    spec = importlib.util.spec_from_file_location("compare", HERE / "compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quantile(level: float, df: float) -> float:
    return float(special.stdtrit(df, level)) if np.isfinite(df) else float(special.ndtri(level))


def top_level(a: Accuracy, b: Accuracy) -> tuple[float, float, str]:
    """(the run's top-level part of Var(A − B), the variance one top-level unit adds, its units as printed). Several
    teacher seeds: each teacher seed's mean over its student seeds, A's less B's, s²/n and s²; one: the student
    seeds, paired by label where both models have the same labels, else each model's spread apart, s_A²/n_A +
    s_B²/n_B and s_A² + s_B² (a model of one seed adds nothing: its spread is unknown)."""
    teachers = a.teacher_seeds
    if len(teachers) > 1:
        if b.teacher_seeds != teachers:
            raise SystemExit(f"the models have other teacher seeds ({teachers} and {b.teacher_seeds})")
        units = np.array(
            [a.correct[a.units_of(t)].mean() - b.correct[b.units_of(t)].mean() for t in teachers], dtype=np.float64
        )
        return float(units.var(ddof=1)) / len(units), float(units.var(ddof=1)), str(len(units))
    acc_a, acc_b = a.correct.mean(1), b.correct.mean(1)
    if a.seeds is not None and b.seeds is not None and sorted(a.seeds) == sorted(b.seeds) and len(acc_a) > 1:
        order_a, order_b = np.argsort(a.seeds, kind="stable"), np.argsort(b.seeds, kind="stable")
        units = acc_a[order_a] - acc_b[order_b]
        return float(units.var(ddof=1)) / len(units), float(units.var(ddof=1)), str(len(units))
    known = [acc for acc in (acc_a, acc_b) if len(acc) > 1]
    run = sum(float(acc.var(ddof=1)) / len(acc) for acc in known)
    return run, sum(float(acc.var(ddof=1)) for acc in known), f"{len(acc_a)} and {len(acc_b)}"


def projected(per_unit: float, rows_part: float, rows: int, designs: int, factor: float) -> tuple[float, float]:
    """(se, degrees of freedom) of a design of ``designs`` top-level units (each adding ``per_unit``) and ``factor``
    times the rows (or clusters of rows), of which the run has ``rows``."""
    top_new = per_unit / designs
    rows_new = rows_part / factor
    se2 = top_new + rows_new
    terms = [(top_new, designs - 1.0), (rows_new, max(rows * factor - 1.0, 1.0))]
    denominator = sum(v**2 / df for v, df in terms if v > 0)
    return float(np.sqrt(se2)), (se2**2 / denominator if denominator > 0 else np.inf)


def reach(se: float, df: float, kind: str) -> float:
    """The smallest difference found 80% of the time at 5% (``beats``), or the smallest margin two one-sided tests
    confirm 80% of the time were the difference zero (``matches``)."""
    if kind == "matches":
        return (quantile(0.95, df) + quantile(0.90, df)) * se
    return (quantile(0.975, df) + quantile(0.80, df)) * se


def main(argv: list[str] | None = None) -> None:
    script = _compare_script()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=script.EPILOG)
    parser.add_argument(
        "--teacher-seeds", type=int, nargs="+", default=[3, 5, 10, 20], metavar="T",
        help="the designs' numbers of teacher seeds (default: 3 5 10 20)",
    )  # fmt: skip
    parser.add_argument(
        "--rows-factor", type=float, nargs="+", default=[1.0], metavar="F",
        help="the designs' test rows, as multiples of the run's (default: 1)",
    )  # fmt: skip
    parser.add_argument("--target", type=float, help="points a plain 'beats' claim should be detected at")
    args, models, claims = script.arguments(argv, parser)
    if any(t < 2 for t in args.teacher_seeds) or not all(0 < f < np.inf for f in args.rows_factor):
        raise SystemExit("--teacher-seeds: at least 2 each; --rows-factor: above 0, finite")
    if args.target is not None and not 0 < args.target < 100:
        raise SystemExit(f"--target {args.target:g}: points above 0 and below 100")
    if not claims:
        raise SystemExit("no --claim: power.py projects claims ('A beats B [by GAP]' or 'A matches B within M')")
    if args.metric[0] != "accuracy" or args.also:
        raise SystemExit("power.py projects accuracy claims of one experiment's runs (no --metric, no --also)")
    runs = {"": args.results}
    found = {name: script.joined(runs, parts, args.split) for name, parts in models.items()}
    files = {name: [paths for _, _, paths in units] for name, (_, units) in found.items()}
    rows, columns = script.read_rows(files, "accuracy", None)
    test_rows = script.same_rows(found, runs, rows, columns, args.split)
    metrics = {m: script.metric_of("accuracy", None, columns[m], None, 15, found[m][1]) for m in files}
    labels, units_of_rows, drawn = None, len(test_rows), "rows"
    if args.cluster_column:
        column = args.cluster_column
        labels, units_of_rows, _ = script.cluster_labels(args.results[0], args.split, column, test_rows, None)
        drawn = f"rows in {units_of_rows:,} clusters by {args.cluster_column!r}"
    several = len(args.results) > 1
    level = "teacher seeds" if several else "student seeds (one teacher seed: its variance unknown)"
    print(f"{len(test_rows):,} {args.split} {drawn}; designs over {level}, rows times {args.rows_factor}.")
    note = script.seed_note(metrics).strip()
    print(f"{note}\n" if note else "")
    print("| claim | A − B | se | top level (units) | rows' part | design | reach | reaches the target |")
    print("| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |")
    for text, (a, kind, b, points) in claims.items():
        if len(a) > 1:
            print(f"| {text} | — | — | — | — | not projected: a difference of gains | — | — |")
            continue
        result = compare(metrics[a[0]], metrics[b[0]], clusters=labels)
        top, per_unit, units = top_level(metrics[a[0]], metrics[b[0]])
        rows_part = max(result.se**2 - top, 0.0)
        target = points if points > 0 else (args.target / 100 if args.target else abs(result.difference))
        for designs in args.teacher_seeds:
            fewer_rows = np.inf  # the reach of this many units at the next smaller rows factor
            for factor in sorted(args.rows_factor):
                se, df = projected(per_unit, rows_part, units_of_rows, designs, factor)
                needed = reach(se, df, kind)
                worse = " (more rows lower the degrees of freedom)" if needed > fewer_rows else ""
                fewer_rows = needed
                print(
                    f"| {text} | {100 * result.difference:+.1f} | {100 * result.se:.2f} | "
                    f"{100 * np.sqrt(top):.2f} ({units}) | {100 * np.sqrt(rows_part):.2f} | "
                    f"{designs} × {factor:g} rows | {100 * needed:.1f}{worse} | "
                    f"{'yes' if needed <= target else 'no'} ({100 * target:.1f}) |"
                )


if __name__ == "__main__":
    main()
