"""Accuracy intervals and paired verdicts of a finished run, as the benchmark write-ups give them
(docs/report.md, "Intervals and verdicts"; docs/experiments/benchmarks.md).

    .venv/bin/python experiments/benchmarks/compare.py --results results \\
        --models kd_all dd_margin_10 dd_random_10 \\
        --claim "dd_margin_10 beats dd_random_10 by 2.9" --claim "dd_margin_10 matches kd_all within 1"

A model is a base name: its seeds are ``results/eval/NAME.seed*/`` (or ``results/eval/NAME/`` for one). A claim
is ``A beats B [by GAP]`` (GAP 0 when left out) or ``A matches B within MARGIN`` (MARGIN > 0), in accuracy points,
between two different models. Prints Markdown: one table of the
models (mean accuracy, 95% interval over seeds and test rows, the gold labels each read) and one of the claims
(A − B, its interval, the paired bootstrap p-value, the smallest difference the design detects, the verdict).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np

from kdpipe.evaluation.paired import compare, interval
from kdpipe.report.intervals import correct_matrix
from kdpipe.report.summary import describe_label_use

NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
CLAIM = re.compile(rf"^\s*(\S+)\s+(?:(beats)\s+(\S+)(?:\s+by\s+{NUMBER})?|(matches)\s+(\S+)\s+within\s+{NUMBER})\s*$")


def evaluations(results: Path, model: str, split: str) -> list[Path]:
    """The evaluation files of a model's seeds (``NAME.seedK``, in seed order) or of the model alone."""
    seeds = sorted(
        results.glob(f"eval/{model}.seed*/{split}.json"),
        key=lambda p: int(p.parent.name.rsplit("seed", 1)[1]),
    )
    single = results / "eval" / model / f"{split}.json"
    found = seeds or ([single] if single.is_file() else [])
    if not found:
        raise SystemExit(f"{results}/eval: no {split}.json of model '{model}' (or of {model}.seed*)")
    return found


def model_row(name: str, paths: list[Path], correct: np.ndarray) -> str:
    records = [json.loads(p.read_text()) for p in paths]
    mean, low, high = interval(correct)
    f1 = [r["metrics"]["macro_f1"] for r in records]
    uses = (describe_label_use(r.get("gold_labels"), r.get("transfer_rows")) for r in records)
    labels = " / ".join(dict.fromkeys(uses))
    spread = f" ± {100 * np.std(f1, ddof=1):.1f}" if len(f1) > 1 else ""
    return (
        f"| `{name}` | {len(paths)} | {100 * mean:.1f} | [{100 * low:.1f}, {100 * high:.1f}] | "
        f"{100 * np.mean(f1):.1f}{spread} | {labels} |"
    )


def parse_claim(text: str, models: list[str]) -> tuple[str, str, str, float]:
    """(A, "beats" or "matches", B, the gap or margin as a fraction) of a ``--claim``; stops on a malformed one."""
    match = CLAIM.match(text)
    if not match:
        raise SystemExit(f"--claim {text!r}: write 'A beats B [by GAP]' or 'A matches B within MARGIN' (points)")
    a, beats, b_beats, gap, matches, b_matches, margin = match.groups()
    kind, b, amount = ("beats", b_beats, gap) if beats else ("matches", b_matches, margin)
    missing = [m for m in (a, b) if m not in models]
    if missing:
        raise SystemExit(f"--claim {text!r}: {', '.join(missing)} not among --models")
    if a == b:
        raise SystemExit(f"--claim {text!r}: compares {a} with itself")
    points = float(amount) / 100 if amount else 0.0
    if kind == "matches" and points <= 0:
        raise SystemExit(f"--claim {text!r}: a margin of 0 can never be shown; give the largest gap that still matches")
    return a, kind, b, points


def claim_row(text: str, claim: tuple[str, str, str, float], matrices: dict[str, np.ndarray]) -> str:
    a, kind, b, points = claim
    result = compare(matrices[a], matrices[b], claim=kind, gap=points, margin=points)
    return (
        f"| {text} | {100 * result.difference:+.1f} | [{100 * result.low:+.1f}, {100 * result.high:+.1f}] | "
        f"{result.p_value:.3f} | {100 * result.detectable:.1f} | **{result.verdict}** |"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"), help="the run's results/ folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--models", nargs="+", required=True, help="base names (their seeds are found)")
    parser.add_argument("--claim", action="append", default=[], help="'A beats B [by GAP]' or 'A matches B within M'")
    args = parser.parse_args(argv)

    claims = {text: parse_claim(text, args.models) for text in args.claim}
    files = {m: evaluations(args.results, m, args.split) for m in args.models}
    matrices, rows = {}, None
    for model, paths in files.items():
        ids, matrices[model] = correct_matrix(paths)
        if rows is not None and not np.array_equal(ids, rows):
            raise SystemExit(f"model '{model}' was evaluated on other {args.split} rows than the models before it")
        rows = ids
    print(f"{len(rows)} {args.split} rows; 95% intervals over seeds and rows (4,000 bootstrap draws).\n")
    print("| model | seeds | accuracy (%) | 95% interval | macro-F1 (%) | gold labels read |")
    print("| --- | ---: | ---: | --- | ---: | --- |")
    for model, paths in files.items():
        print(model_row(model, paths, matrices[model]))
    if args.claim:
        print("\n| claim | A − B (points) | 95% interval | p | detectable | verdict |")
        print("| --- | ---: | --- | ---: | ---: | --- |")
        for text, claim in claims.items():
            print(claim_row(text, claim, matrices))


if __name__ == "__main__":
    main()
