"""Intervals and paired verdicts of a finished run, as the benchmark write-ups give them
(docs/report.md, "Intervals and verdicts"; docs/experiments/benchmarks.md).

    .venv/bin/python experiments/benchmarks/compare.py --results runs/t0/results runs/t1/results runs/t2/results \\
        --models kd_all dd_margin_10 dd_random_10 \\
        --claim "dd_margin_10 beats dd_random_10 by 2.9" --claim "dd_margin_10 matches kd_all within 1"

``--results`` names one run's results/ folder, or several: the runs of one experiment under other teacher seeds
(each folder one teacher seed: the same config and data split, the teachers trained with another ``seed``), so that
every interval includes the teacher-seed variance; with one folder the tables say that they exclude it. A model is a
base name: its seeds are ``results/eval/NAME.seed*/``, or ``results/eval/NAME/`` when that folder exists (one model:
a teacher ensemble is ``NAME/``, its members ``NAME.seedK/``; write ``NAME.seed*`` for the members as seeds of one
model), in every folder. A student entry with ``per_domain: true`` is one model, its family: each seed's domain
students (``NAME.DOMAIN.seedK``), each scored on its own domain's rows, joined into one prediction of the split;
``NAME=A+B+...`` joins models on disjoint rows the same way (seed k of each). ``--also LABEL=DIR [DIR ...]`` adds
another run's results/ (one folder per teacher seed) that scored the same texts (e.g. the same test reviews after a
domain's training rows were cut): its models are ``LABEL:NAME``, and their rows are matched to this run's by text,
since the two runs number their rows apart. ``--cluster-column COLUMN`` draws the rows in clusters: the rows of one
value of that column of the prepared dataset (``results/data/NAME/SPLIT.parquet``, e.g. ``text``, a QNLI pair's
question, or ``group``, written by ``dataset.split.group_column``) are drawn together.

A claim is ``A beats B [by GAP]`` (GAP 0 when left out) or ``A matches B within MARGIN`` (MARGIN > 0), in points of
the metric, between two different models, or the same between two gains, ``(A - B) beats (C - D)``: A's gain over B
is larger than C's over D, tested on the same rows. "A beats B" tests its direction (A − B against 0) and, with a
gap, its size (A − B against GAP), two verdicts; "A matches B" is two one-sided tests (the 90% interval inside
±MARGIN). Every test of every ``--claim`` of one call is one family, adjusted with Holm's step-down method: a test is
decided when its Holm-adjusted p is below 0.05. Prints Markdown: one table of the models (mean accuracy, 95%
interval over teacher seeds, student seeds and test rows, the gold labels each read) and one of the claims' tests
(A − B, its 95% interval, the raw and the Holm-adjusted p, the smallest difference the design detects, or for
"matches" the smallest margin it confirms, the verdict); where a model has several teacher seeds, also each model's
accuracy under each (each results folder's mean over its student seeds, by the folders' order in their run); with a
domain column, also the accuracy per domain.

``--metric`` chooses what is compared: ``accuracy`` (the default), ``ece`` (the expected calibration error, 15
bins; lower is better, so "A beats B" means A − B below 0) or ``auroc:SCORE``: how well the uncertainty score SCORE
(``max_prob``, ``entropy``, ``expected_entropy``, ``mutual_info``, or their ``mc_`` estimates) tells the run's OOD
rows (``evaluate.ood``) from its test rows; the test and the OOD rows are drawn apart in the bootstrap.
``--ood-class CLASS`` keeps the OOD rows of one held-out class (``evaluate.ood.classes``).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import torch
from torchmetrics.functional.classification import multiclass_f1_score

from kdpipe.core.store import KdpipeError
from kdpipe.evaluation.ood import score_column
from kdpipe.evaluation.paired import ALPHA, Accuracy, Auroc, CalibrationError, compare, compare_gains, family, interval
from kdpipe.report.intervals import prediction_rows, predictions_path, row_matrix
from kdpipe.report.summary import describe_label_use

NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
SIDE = r"(\(\s*\S+\s+-\s+\S+\s*\)|\S+)"  # a model, or a gain "(A - B)"
CLAIM = re.compile(
    rf"^\s*{SIDE}\s+(?:(beats)\s+{SIDE}(?:\s+by\s+{NUMBER})?|(matches)\s+{SIDE}\s+within\s+{NUMBER})\s*$"
)


def evaluations(results: Path, model: str, split: str) -> dict[int, list[Path]]:
    """{seed: the evaluation files whose rows make that seed's predictions}: the one file of ``NAME`` (seed 0) when
    it exists, else seeds read from the folder names, the one file of ``NAME.seedK`` (only those for a model written
    ``NAME.seed*``), or for a per-domain family (a student entry with
    ``per_domain: true``) the files of its domain students ``NAME.DOMAIN.seedK`` (``NAME.DOMAIN`` where the student
    has one seed: the seed its evaluation records), each on its own domain's rows."""
    folders = [p.parent for p in (results / "eval").glob(f"*/{split}.json")]
    only_seeds = model.endswith(".seed*")
    model = model.removesuffix(".seed*")
    if not only_seeds and (results / "eval" / model / f"{split}.json").is_file():
        return {0: [results / "eval" / model / f"{split}.json"]}  # one model, e.g. an ensemble beside its members
    seeds = {}
    for folder in folders:
        match = re.fullmatch(rf"{re.escape(model)}\.seed(\d+)", folder.name)
        seed = int(match[1]) if match else None
        if seed in seeds:  # e.g. NAME.seed1 and NAME.seed01
            both = " and ".join(sorted((seeds[seed][0].parent.name, folder.name)))
            raise SystemExit(f"{results}/eval: {both} are both seed {seed}")
        if match:
            seeds[seed] = [folder / f"{split}.json"]
    if seeds or only_seeds:
        if not seeds:
            raise SystemExit(f"{results}/eval: no {split}.json of {model}.seedK")
        return dict(sorted(seeds.items()))
    family: dict[int, dict[str, Path]] = defaultdict(dict)
    for folder in folders:
        match = re.fullmatch(rf"{re.escape(model)}\.(.+?)(?:\.seed(\d+))?", folder.name)
        record = read_record(folder / f"{split}.json") if match else {}
        if record.get("group") == model and record.get("domain"):
            seed = int(match[2]) if match[2] is not None else int(record.get("seed", 0))
            family[seed][record["domain"]] = folder / f"{split}.json"
            check_domain(folder / f"{split}.json", record["domain"])
    if not family:
        raise SystemExit(
            f"{results}/eval: no {split}.json of model {model!r} "
            f"({model}.seedK, or {model}.DOMAIN.seedK or {model}.DOMAIN)"
        )
    domains = sorted(set().union(*family.values()))
    for seed, students in sorted(family.items()):
        if len(students) < len(domains):
            missing = ", ".join(d for d in domains if d not in students)
            raise SystemExit(f"{results}/eval: family '{model}' seed {seed} has no {split}.json for domain {missing}")
    return {seed: [family[seed][d] for d in domains] for seed in sorted(family)}


def check_domain(evaluation: Path, domain: str) -> None:
    """A domain student's predictions must be of its own domain's rows (when they carry the rows' domains)."""
    path = predictions_path(evaluation)
    if path.is_file() and "domain" in pq.read_schema(path).names:  # (a missing file is refused when it is read)
        found = set(pq.read_table(path, columns=["domain"]).column("domain").to_pylist())
        if found - {domain}:
            raise SystemExit(f"{path}: a student of domain {domain!r} has predictions of rows of {sorted(found)}")


def model_spec(text: str) -> tuple[str, list[str]]:
    """(name, the models joined into it) of one ``--models`` entry: ``NAME``, or ``NAME=A+B+...``."""
    name, _, joined_parts = text.partition("=") if "=" in text else (text, "", text)
    parts = joined_parts.split("+")
    if not name or not all(parts) or any(c in name for c in "+=") or (":" in name and name != text):
        raise SystemExit(
            f"--models {text!r}: write NAME, or NAME=A+B+... to join models on disjoint rows (a NAME of your own has "
            "no ':', which marks another run's model, LABEL:NAME)"
        )
    return name, parts


def run_of(part: str, runs: dict[str, list[Path]]) -> tuple[str, str]:
    """(the run's label, "" for --results; the model's name in it) of a model name, ``NAME`` or ``LABEL:NAME``."""
    label, colon, name = part.rpartition(":")
    if colon and not label:
        raise SystemExit(f"--models {part!r}: write NAME, or LABEL:NAME for a model of another run (--also)")
    if label and label not in runs:
        raise SystemExit(f"--models {part!r}: no run {label!r} (give it as --also {label}=DIR)")
    return label, name


Unit = tuple[str, str, list[Path]]  # (teacher seed, student seed, the evaluation files of that seed's predictions)


def joined(runs: dict[str, list[Path]], parts: list[str], split: str) -> tuple[str, list[Unit]]:
    """(the run's label, its units) of one model, or of several models of one run on disjoint rows (``NAME=A+B``,
    e.g. one single-domain student per domain) joined seed by seed (seed k of each): for each of the run's folders
    (teacher seed k: its position) and each seed, in seed order, the evaluation files."""
    labels, names = zip(*(run_of(part, runs) for part in parts))
    if len(set(labels)) > 1:
        raise SystemExit(f"--models {'+'.join(parts)}: joined models must come from one run")
    units = []
    for teacher, folder in enumerate(runs[labels[0]]):
        per_part = [evaluations(folder, name, split) for name in names]
        if len({tuple(seeds) for seeds in per_part}) > 1:
            found = ", ".join(f"{part} {sorted(seeds)}" for part, seeds in zip(parts, per_part))
            raise SystemExit(f"--models {'+'.join(parts)}: joined models need the same seeds ({found})")
        for seed in per_part[0]:
            units.append((str(teacher), str(seed), [path for seeds in per_part for path in seeds[seed]]))
    return labels[0], units


def row_texts(results: Path, split: str) -> pd.Series:
    """The text of each row of a run's split (with its pair side, if any), indexed by row_id, from its prepared data
    (``results/data/NAME/SPLIT.parquet``)."""
    found = sorted((results / "data").glob(f"*/{split}.parquet"))
    if len(found) != 1:
        raise SystemExit(f"{results}/data: expected one prepared dataset with a {split} split, found {len(found)}")
    present = pq.read_schema(found[0]).names
    if not {"row_id", "text"} <= set(present):
        raise SystemExit(f"{found[0]}: no row_id and text columns, so its rows cannot be matched by text")
    table = pq.read_table(found[0], columns=[c for c in ("row_id", "text", "text_pair") if c in present]).to_pandas()
    if table["row_id"].duplicated().any() or table["text"].isna().any():
        raise SystemExit(f"{found[0]}: repeated row ids or rows without a text, so rows cannot be matched by text")
    key = table["text"]
    if "text_pair" in table:  # a pair's second side; a row without one reads as a single text
        pair = table["text_pair"].fillna("")
        key = key.where(pair == "", key + "\x1f" + pair)
    return pd.Series(key.to_numpy(), index=table["row_id"].to_numpy())


def to_main_rows(model: str, ids: np.ndarray, theirs: pd.Series, ours: pd.Series) -> np.ndarray:
    """The row ids in the --results run of another run's rows ``ids``, matched by text; stops on a text it lacks."""
    if ours.duplicated().any():
        raise SystemExit("--also: the --results run's split repeats a text, so rows cannot be matched by text")
    unknown = np.setdiff1d(ids, theirs.index.to_numpy())
    if len(unknown):
        raise SystemExit(f"model '{model}': {len(unknown):,} of its rows are not in its run's prepared split")
    index = pd.Series(ours.index, index=ours.to_numpy())
    mapped = index.reindex(theirs.reindex(ids).to_numpy())
    if mapped.isna().any():
        raise SystemExit(
            f"model '{model}': {int(mapped.isna().sum()):,} of its rows have texts that are not in the --results "
            "run's split; a model of another run must be scored on the same texts"
        )
    return mapped.to_numpy(dtype=np.int64)


def records(evaluation: list[Path]) -> list[dict]:
    return [read_record(p) for p in evaluation]


def read_record(path: Path) -> dict:
    """An evaluation's ``{split}.json``; stops with its path when it is not JSON (a write cut short)."""
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise SystemExit(f"{path}: not a readable evaluation record ({err}); run its evaluation again") from None


def macro_f1(evaluation: list[Path]) -> float:
    """The recorded macro-F1 of one evaluation; of joined ones, from their predictions with torchmetrics, as kdpipe's
    metrics compute it (the mean over the classes in the labels or the predictions); NaN without them."""
    if len(evaluation) == 1:
        return records(evaluation)[0]["metrics"]["macro_f1"]
    table = prediction_rows(evaluation, ["row_id", "label", "pred"])
    if not {"label", "pred"} <= set(table):
        return float("nan")
    classes, index = np.unique(
        np.concatenate([table["label"].astype(str), table["pred"].astype(str)]), return_inverse=True
    )
    label, pred = (torch.from_numpy(part) for part in np.split(index, 2))
    return float(multiclass_f1_score(pred, label, num_classes=len(classes), average="macro"))


def label_use(parts: list[dict]) -> str:
    """The gold labels one seed read, in words: of one evaluation as the report says it; of joined ones (the students
    of a family, one per domain) each split's rows as a range over the parts, "each:" before them."""
    uses = [p.get("gold_labels") for p in parts]
    if len(parts) == 1 or not all(uses) or any(p.get("transfer_rows") for p in parts):
        words = (describe_label_use(p.get("gold_labels"), p.get("transfer_rows")) for p in parts)
        return " / ".join(dict.fromkeys(words))
    ranges = {}
    order = ["train", "validation", "router: train", "router: validation", "test"]
    for split in sorted({k for use in uses for k in use}, key=lambda k: (order + [k]).index(k)):
        rows = [use.get(split, 0) for use in uses]
        if not all(isinstance(r, int) for r in rows):
            return " / ".join(dict.fromkeys(describe_label_use(use) for use in uses))
        ranges[split] = f"{min(rows):,}" if min(rows) == max(rows) else f"{min(rows):,}–{max(rows):,}"
    return "each: " + " · ".join(f"{split} {rows}" for split, rows in ranges.items())


def seeds_cell(teachers: list[str]) -> str:
    """The seeds of a model: its student seeds, or "T × S" over several teacher seeds (S a range where they differ)."""
    per_teacher = [teachers.count(t) for t in dict.fromkeys(teachers)]
    if len(per_teacher) == 1:
        return str(per_teacher[0])
    low, high = min(per_teacher), max(per_teacher)
    return f"{len(per_teacher)} × {low if low == high else f'{low}–{high}'}"


def model_row(name: str, paths: list, metric, with_f1: bool, clusters) -> str:
    mean, low, high = interval(metric, clusters=clusters)
    labels = " / ".join(dict.fromkeys(label_use(records(p)) for p in paths))
    f1_text = ""
    if with_f1:
        f1 = [macro_f1(p) for p in paths]
        spread = f" ± {100 * np.std(f1, ddof=1):.1f}" if len(f1) > 1 else ""
        f1_text = f" {100 * np.mean(f1):.1f}{spread} |" if not np.isnan(f1).any() else " – |"
    seeds = seeds_cell(list(metric.teachers))
    return f"| `{name}` | {seeds} | {100 * mean:.1f} | [{100 * low:.1f}, {100 * high:.1f}] |{f1_text} {labels} |"


METRICS = {"accuracy": "accuracy (%)", "ece": "ECE (%)", "auroc": "AUROC (%)"}


def parse_metric(text: str, split: str) -> tuple[str, str | None]:
    """(kind, the uncertainty score or None) of a ``--metric``: accuracy, ece or auroc:SCORE."""
    kind, colon, score = text.partition(":")
    if kind not in METRICS or bool(colon) != (kind == "auroc") or (colon and not score):
        raise SystemExit(f"--metric {text!r}: write accuracy, ece, or auroc:SCORE (e.g. auroc:mc_mutual_info)")
    if kind == "auroc":
        try:
            score_column(score)
        except KdpipeError as error:
            raise SystemExit(f"--metric {text!r}: {error}") from None
        if split != "test":
            raise SystemExit(f"--metric {text!r}: OOD rows are compared with the test rows; leave --split test")
    return kind, score or None


def metric_of(
    kind: str, score: str | None, columns: dict[str, np.ndarray], ood: np.ndarray | None, bins: int, units: list
):
    """The paired-statistics metric of one model from its per-unit row matrices (``columns``) and, for an AUROC,
    its OOD rows' score matrix; ``bins``: the ECE's confidence bins; ``units``: each matrix row's (teacher seed,
    student seed)."""
    design = {"teachers": [t for t, _, _ in units], "seeds": [s for _, s, _ in units]}
    if kind == "accuracy":
        return Accuracy(columns["correct"], **design)
    if kind == "ece":
        return CalibrationError(columns["confidence"], columns["correct"], bins=bins, **design)
    column, sign = score_column(score)
    return Auroc(sign * columns[column], sign * ood, **design)


def metric_columns(kind: str, score: str | None) -> list[str]:
    """The predictions' columns a metric reads on the compared split."""
    return {"accuracy": ["correct"], "ece": ["correct", "confidence"]}.get(kind) or [score_column(score)[0]]


def domain_table(files: dict[str, list]) -> list[str]:
    """Accuracy per domain (mean over seeds) of each model whose every prediction carries each row's domain; the
    mean over domains only for a model with every domain."""
    per_model = {}
    for model, paths in files.items():
        tables = [prediction_rows(p, ["row_id", "correct", "domain"]) for p in paths]
        if all("domain" in t and t["domain"].notna().all() for t in tables):
            per_model[model] = pd.concat(tables).groupby("domain")["correct"].mean()
    if not per_model:
        return []
    domains = sorted(set().union(*(s.index for s in per_model.values())))
    lines = ["| model | " + " | ".join(domains) + " | mean over domains |", "| --- |" + " ---: |" * (len(domains) + 1)]
    for model, accuracy in per_model.items():
        cells = [f"{100 * accuracy[d]:.1f}" if d in accuracy else "" for d in domains]
        mean = f"{100 * accuracy.mean():.1f}" if len(accuracy) == len(domains) else ""
        lines.append(f"| `{model}` | " + " | ".join(cells) + f" | {mean} |")
    return lines


def teacher_seed_table(metrics: dict) -> list[str]:
    """Accuracy per teacher seed, column k the k-th folder of each run (of --results, or of the model's --also run),
    the mean over that folder's student seeds, of the rows the intervals use; none when no model has several."""
    width = max(len(metric.teacher_seeds) for metric in metrics.values())
    if width < 2:
        return []
    lines = ["| model | " + " | ".join(f"folder {k + 1}" for k in range(width)) + " |", "| --- |" + " ---: |" * width]
    for model, metric in metrics.items():
        cells = []
        for position in range(width):
            units = metric.correct[metric.teachers == str(position)]
            cells.append(f"{100 * units.mean():.1f}" if len(units) else "–")
        lines.append(f"| `{model}` | " + " | ".join(cells) + " |")
    return lines


Side = tuple[str, ...]  # a model (A,) or a gain (A, B): A - B


def parse_claim(text: str, models: list[str]) -> tuple[Side, str, Side, float]:
    """(A, "beats" or "matches", B, the gap or margin as a fraction) of a ``--claim``, each side a model or a gain;
    stops on a malformed one."""
    match = CLAIM.match(text)
    if not match and re.search(r"\s(by|within)\s+-", text):
        raise SystemExit(f"--claim {text!r}: a gap or margin is a size in points, 0 or more (the sides give the sign)")
    if not match:
        raise SystemExit(
            f"--claim {text!r}: write 'A beats B [by GAP]', 'A matches B within MARGIN' (points), or the same "
            "between two gains, '(A - B) beats (C - D)'"
        )
    a_side, beats, b_beats, gap, matches, b_matches, margin = match.groups()
    kind, b_side, amount = ("beats", b_beats, gap) if beats else ("matches", b_matches, margin)
    a, b = (tuple(t for t in re.findall(r"[^\s()]+", side) if t != "-") for side in (a_side, b_side))
    if len(a) != len(b):
        raise SystemExit(f"--claim {text!r}: compares a model with a gain; compare two models or two gains")
    missing = [m for m in a + b if m not in models]
    if missing:
        hint = "; write a gain as (A - B), with spaces" if any("-" in m for m in missing) else ""
        raise SystemExit(f"--claim {text!r}: {', '.join(missing)} not among --models{hint}")
    if a == b or (len(a) == 2 and (a[0] == a[1] or b[0] == b[1])):
        raise SystemExit(f"--claim {text!r}: compares a model with itself")
    points = float(amount) / 100 if amount else 0.0
    if points >= 1:
        raise SystemExit(f"--claim {text!r}: a gap or margin of {amount} points is the whole 0-100 scale or more")
    if kind == "matches" and points <= 0:
        raise SystemExit(f"--claim {text!r}: a margin of 0 can never be shown; give the largest gap that still matches")
    return a, kind, b, points


def claim_rows(claims: dict[str, tuple], metrics: dict, clusters) -> tuple[list[str], int]:
    """The claims' table rows, one per test, every test of every claim adjusted together (Holm), and the number of
    tests."""
    results = []
    for claim in claims.values():
        a, kind, b, points = claim
        test = compare if len(a) == 1 else compare_gains
        results.append(test(*(metrics[m] for m in a + b), claim=kind, gap=points, margin=points, clusters=clusters))
    decisions = family([result.tests for result in results])
    lines = []
    for (text, (a, _, b, points)), result, decision in zip(claims.items(), results, decisions, strict=True):
        caveat = drawing_caveat([metrics[m] for m in a + b])
        for test, adjusted, verdict in zip(result.tests, decision.adjusted, decision.verdicts, strict=True):
            if test.name == "equivalence":
                inside = f"[{100 * result.low90:+.1f}, {100 * result.high90:+.1f}]"
                what = f"equivalence: 90% interval {inside} in ±{100 * points:g}"
                reach = f"±{100 * result.confirmable:.1f}"
            else:
                what = f"{test.name}: against {100 * points:g}" if test.name == "size" else "direction: against 0"
                reach = f"{100 * result.detectable:.1f}"
            if len(result.tests) > 1:
                verdict = f"{test.name} {verdict}"
            lines.append(
                f"| {text} | {100 * result.difference:+.1f} | [{100 * result.low:+.1f}, {100 * result.high:+.1f}] | "
                f"{what} | {p_text(test.p_value)} | {p_text(adjusted)} | {reach} | **{verdict}**{caveat} |"
            )
    return lines, sum(len(result.tests) for result in results)


def drawing_caveat(models: list) -> str:
    """What a claim's verdict leaves out, said beside it, or '': a model of one seed (its seed-to-seed variance is
    not sampled), or models of one teacher seed whose student seeds differ (drawn apart, not paired by seed)."""
    if any(len(m.teachers) == 1 for m in models):
        return " (a model of one seed: its seeds' variance is not in the interval)"
    if all(len(m.teacher_seeds) == 1 for m in models) and len({tuple(sorted(m.seeds)) for m in models}) > 1:
        return " (other student seeds: drawn apart, not paired)"
    return ""


def p_text(p: float) -> str:
    return "<0.001" if p < 0.0005 else f"{p:.3f}"


def ood_scores(
    results: Path, model: str, parts: list[str], score: str, split: str, ood_class: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(row_ids, [seeds, N_ood] matrix) of the predictions column of ``score`` on one model's OOD rows, its seeds
    those of its ``split`` evaluations; stops where a seed has no such score. ``ood_class``: only the OOD rows of
    that held-out class (``evaluate.ood.classes``)."""
    test_seeds = evaluations(results, parts[0], split)
    seeds = evaluations(results, parts[0], "ood")
    if sorted(seeds) != sorted(test_seeds):
        raise SystemExit(
            f"model '{model}': its {split} evaluations are of seeds {sorted(test_seeds)}, its OOD evaluations of "
            f"{sorted(seeds)}; each seed needs both"
        )
    if any(len(paths) > 1 for paths in seeds.values()):
        raise SystemExit(f"--metric auroc: '{model}' is a per-domain family; its students share the OOD rows")
    for paths in seeds.values():
        record = records(paths)[0].get("ood") or {}
        if record.get("scores") is None:
            raise SystemExit(
                f"model '{model}': {paths[0]} has no OOD scores ({record.get('reason', 'no reason given')})"
            )
        if score not in record["scores"]:
            raise SystemExit(
                f"model '{model}': {paths[0]} has no score {score!r} (it has {', '.join(record['scores'])}; a model "
                "of one member has no expected_entropy or mutual_info)"
            )
    try:
        ids, matrix = row_matrix([paths for _, paths in sorted(seeds.items())], score_column(score)[0])
        if ood_class is None:
            return ids, matrix
        keep = ood_class_rows(model, seeds, ids, ood_class)
    except KdpipeError as error:
        raise SystemExit(f"model '{model}': {error}") from None
    return ids[keep], matrix[:, keep]


def ood_class_rows(model: str, seeds: dict[int, list[Path]], ids: np.ndarray, ood_class: str) -> np.ndarray:
    """Which of the OOD rows ``ids`` are of the held-out class ``ood_class``, by the ``ood_label`` column of every
    seed's predictions; stops where a seed has no such column or a row without a label, or where two seeds label the
    rows differently."""
    labels, first = None, None
    for seed, paths in sorted(seeds.items()):
        table = prediction_rows(paths, ["row_id", "ood_label"])
        if "ood_label" not in table or table["ood_label"].isna().all():
            raise SystemExit(
                f"--ood-class {ood_class!r}: {paths[0]}'s OOD rows are not held-out classes (no ood_label)"
            )
        if table["ood_label"].isna().any():
            raise SystemExit(f"--ood-class {ood_class!r}: {paths[0]} has OOD rows without an ood_label")
        seed_labels = table.set_index("row_id").loc[ids, "ood_label"].to_numpy()
        if labels is None:
            labels, first = seed_labels, seed
        elif not np.array_equal(seed_labels, labels):
            raise SystemExit(f"model '{model}': seed {seed} labels its OOD rows other than seed {first} does")
    classes = sorted(set(labels))
    if ood_class not in classes:
        raise SystemExit(
            f"--ood-class {ood_class!r}: model '{model}' has no OOD rows of it; its held-out classes are "
            + ", ".join(classes)
        )
    return labels == ood_class


def ece_bins(files: dict[str, list]) -> int:
    """The number of confidence bins of the evaluations' ECE (``evaluate.ece_bins``, read from their reliability
    bins; 15, kdpipe's default, where an evaluation has none); stops when the models' counts differ."""
    found = set()
    for paths in files.values():
        for record in (r for seed in paths for r in records(seed)):
            edges = record.get("metrics", {}).get("reliability", {}).get("bin_edges")
            found.add(len(edges) - 1 if edges else 15)
    if len(found) > 1:
        raise SystemExit(f"--metric ece: the evaluations' ECE use different numbers of bins ({sorted(found)})")
    return found.pop()


def check_ood_rows(ood: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    first = next(iter(ood))
    for model, (ids, _) in ood.items():
        if not np.array_equal(ids, ood[first][0]):
            raise SystemExit(f"models '{first}' and '{model}' were evaluated on other OOD rows")


def ood_units(
    folders: list[Path], model: str, parts: list[str], score: str, split: str, ood_class: str | None
) -> tuple[np.ndarray, np.ndarray]:
    """(row_ids, [units, N_ood]) of a model's OOD scores over the teacher seeds' folders, in the order of its units;
    stops where the folders' OOD rows differ."""
    found = [ood_scores(folder, model, parts, score, split, ood_class) for folder in folders]
    for folder, (ids, _) in zip(folders[1:], found[1:]):
        if not np.array_equal(ids, found[0][0]):
            raise SystemExit(f"model '{model}': its OOD rows in {folder} are not those in {folders[0]}")
    return found[0][0], np.concatenate([matrix for _, matrix in found])


def prepared_split(results: Path, split: str) -> Path | None:
    """The one prepared dataset's ``split`` file of a run, or None without exactly one."""
    found = sorted((results / "data").glob(f"*/{split}.parquet"))
    return found[0] if len(found) == 1 else None


def check_same_split(runs: dict[str, list[Path]], split: str) -> None:
    """The folders of one run (its teacher seeds) must hold the same split: the same texts under the same row ids,
    wherever their prepared data is there to compare."""
    for folders in runs.values():
        if len(folders) < 2 or not all(prepared_split(folder, split) for folder in folders):
            continue
        first = row_texts(folders[0], split)
        for folder in folders[1:]:
            if not row_texts(folder, split).equals(first):
                raise SystemExit(
                    f"{folder}: its {split} split is not that of {folders[0]}; the teacher seeds of one experiment "
                    "share the data split (the same dataset and dataset.split), only the teachers' seed changes"
                )


def cluster_labels(
    results: Path, split: str, column: str, row_ids: np.ndarray, ood_ids: np.ndarray | None
) -> tuple[np.ndarray, int, str]:
    """(each row's cluster, test rows then OOD rows; the number of clusters of the test rows; a note) from the
    prepared dataset's ``column``: rows of one value form one cluster. OOD rows take their clusters from the
    dataset's ``ood.parquet`` when it has the column, else each is a cluster of its own (said in the note)."""
    where = f"--cluster-column {column!r}"
    if column == "row_id":
        raise SystemExit(f"{where}: every row is a cluster of its own already; leave the option out")
    path = prepared_split(results, split)
    if path is None:
        raise SystemExit(f"{where}: {results}/data has no one prepared dataset with a {split} split to read it from")
    present = pq.read_schema(path).names
    if column not in present:
        raise SystemExit(f"{where}: {path} has no such column; its columns are {', '.join(present)}")
    values = pq.read_table(path, columns=["row_id", column]).to_pandas().set_index("row_id")[column]
    labels = values.reindex(row_ids)
    if labels.isna().any():
        raise SystemExit(f"{where}: {int(labels.isna().sum()):,} of the compared rows have no value in {path}")
    labels = labels.astype(str).to_numpy()
    count, note = len(set(labels)), ""
    if count < 2:
        raise SystemExit(f"{where}: the compared rows are all in one cluster; drawing clusters needs at least two")
    if ood_ids is not None:
        ood_path = path.with_name("ood.parquet")
        if ood_path.is_file() and column in pq.read_schema(ood_path).names:
            ood = pq.read_table(ood_path, columns=["row_id", column]).to_pandas().set_index("row_id")[column]
            ood = ood.reindex(ood_ids)
            if ood.isna().any():
                raise SystemExit(f"{where}: {int(ood.isna().sum()):,} of the OOD rows have no value in {ood_path}")
            ood_labels = ood.astype(str).to_numpy()
        else:
            ood_labels, note = np.array([f"ood row {i}" for i in ood_ids]), "; each OOD row a cluster of its own"
        labels = np.concatenate([labels, ood_labels])
    return labels, count, note


def also_run(texts: list[str]) -> tuple[str, list[Path]]:
    """(LABEL, its folders) of an ``--also LABEL=DIR [DIR ...]``."""
    label, _, folder = texts[0].partition("=")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", label) or not folder:
        raise SystemExit(f"--also {texts[0]!r}: write LABEL=DIR (a label of letters, digits, '_', '.' or '-')")
    folders = [Path(folder), *map(Path, texts[1:])]
    for path in folders:
        if not (path / "eval").is_dir():
            raise SystemExit(f"--also {' '.join(texts)!r}: {path} has no eval/ folder; give a run's results/")
    return label, teacher_folders(folders, f"--also {label}")


def teacher_folders(folders: list[Path], option: str) -> list[Path]:
    """The folders of one run's teacher seeds, each given once."""
    seen = [folder.resolve() for folder in folders]
    if len(set(seen)) < len(seen):
        raise SystemExit(f"{option}: a folder given twice; each folder is one teacher seed")
    return folders


EPILOG = "docs/report.md, section 'Intervals and verdicts', says how."


def arguments(
    argv: list[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> tuple[argparse.Namespace, dict[str, list[str]], dict]:
    """(the parsed command line, {model: the models joined into it}, {claim text: parsed claim}); stops on a
    malformed one before any file is read. ``parser``: a script's own parser (its options added to it), which these
    options join."""
    parser = parser or argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=EPILOG)
    parser.add_argument(
        "--results", type=Path, nargs="+", default=[Path("results")], metavar="DIR",
        help="the run's results/ folder (default: results), or several: the runs of one experiment under other "
        "teacher seeds (the same config and data split, the teachers trained with another seed), each folder one "
        "teacher seed; the intervals then include the teacher-seed variance",
    )  # fmt: skip
    parser.add_argument(
        "--also", action="append", nargs="+", default=[], metavar=("LABEL=DIR", "DIR"),
        help="another run's results/ folder (or one per teacher seed) that scored the same texts; its models are "
        "LABEL:NAME, its rows matched to this run's by text",
    )  # fmt: skip
    parser.add_argument("--split", default="test")
    parser.add_argument("--models", nargs="+", required=True, help="base names (their seeds are found)")
    parser.add_argument(
        "--claim", action="append", default=[],
        help="'A beats B [by GAP]' or 'A matches B within M' (points), or '(A - B) beats (C - D)'; every claim of "
        "one call is one family, Holm-adjusted",
    )  # fmt: skip
    parser.add_argument(
        "--metric", default="accuracy",
        help="accuracy (default), ece (lower is better) or auroc:SCORE (OOD rows against test rows, by an "
        "uncertainty score: max_prob, entropy, expected_entropy, mutual_info, or their mc_ estimates)",
    )  # fmt: skip
    parser.add_argument(
        "--ood-class", metavar="CLASS", help="auroc: only the OOD rows of this held-out class (evaluate.ood.classes)"
    )
    parser.add_argument(
        "--cluster-column", metavar="COLUMN",
        help="draw rows in clusters: the rows of one value of this column of the prepared dataset "
        "(results/data/NAME/SPLIT.parquet, e.g. text for a pair task's first side, or group) are drawn together",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.results = teacher_folders(args.results, "--results")
    args.metric = parse_metric(args.metric, args.split)
    specs = [model_spec(m) for m in args.models]
    models = dict(specs)
    if len(models) < len(specs):
        raise SystemExit(f"--models: a name given twice ({', '.join(name for name, _ in specs)})")
    if args.ood_class is not None and args.metric[0] != "auroc":
        raise SystemExit("--ood-class selects OOD rows: it goes with --metric auroc:SCORE")
    if args.metric[0] == "auroc" and args.also:
        raise SystemExit("--metric auroc: compares the models of one run, on its own OOD rows; leave out --also")
    joins = [text for text, (name, parts) in zip(args.models, specs, strict=True) if len(parts) > 1]
    if args.metric[0] == "auroc" and joins:
        raise SystemExit(f"--metric auroc: {joins[0]!r} joins models on disjoint test rows, but not their OOD rows")
    claims = [" ".join(text.split()) for text in args.claim]
    if len(set(claims)) < len(claims):
        raise SystemExit(f"--claim: a claim given twice ({'; '.join(claims)}); a family counts each claim once")
    return args, models, {text: parse_claim(text, list(models)) for text in claims}


def read_rows(files: dict[str, list], kind: str, score: str | None) -> tuple[dict, dict]:
    """Per model, its row ids and {column: [units, rows]} of the columns the metric reads."""
    rows, columns = {}, {}
    try:
        for model, paths in files.items():
            read = {column: row_matrix(paths, column) for column in metric_columns(kind, score)}
            rows[model] = next(iter(read.values()))[0]
            columns[model] = {column: matrix for column, (_, matrix) in read.items()}
    except KdpipeError as error:
        raise SystemExit(str(error)) from None
    return rows, columns


def same_rows(found: dict, runs: dict[str, list[Path]], rows: dict, columns: dict, split: str) -> np.ndarray:
    """The row ids every model was scored on: another run's models' rows renumbered as this run's and put in their
    order (``rows`` and ``columns`` updated in place); stops when two models cover other rows."""
    labels = {label for label, _ in found.values()}
    texts = {label: row_texts(runs[label][0], split) for label in labels | {""}} if labels - {""} else {}
    for model, (label, _) in found.items():
        if label:
            ours = to_main_rows(model, rows[model], texts[label], texts[""])
            order = np.argsort(ours, kind="stable")
            rows[model] = ours[order]
            columns[model] = {c: matrix[:, order] for c, matrix in columns[model].items()}
    first = next(iter(rows))
    if len(rows[first]) < 2:
        raise SystemExit(f"model '{first}': its {split} predictions have {len(rows[first])} row(s); a test needs two")
    for model, ids in rows.items():
        if not np.array_equal(ids, rows[first]):
            other = ", other row ids" if len(ids) == len(rows[first]) else ""
            raise SystemExit(
                f"models '{first}' and '{model}' were evaluated on other {split} rows ({len(rows[first]):,} and "
                f"{len(ids):,}{other}); a per-domain family or a NAME=A+B join must cover every domain, and a model of "
                "another run (--also) be scored on the same texts"
            )
    return rows[first]


def teacher_note(runs: dict[str, list[Path]], used: set[str]) -> str:
    """What the intervals hold of the teacher seeds: which runs have several, which one."""
    single = [label for label in runs if label in used and len(runs[label]) == 1]
    several = [label for label in runs if label in used and len(runs[label]) > 1]
    exclude = (
        "the intervals exclude the teacher-seed variance: a difference may be the teacher's this run trained, "
        "not the method's"
    )
    if not several:
        return f"One teacher seed (one results folder): {exclude}."
    notes = []
    for label in several:
        name = "--results" if not label else f"run '{label}'"
        notes.append(f"{len(runs[label])} teacher seeds in {name} ({', '.join(map(str, runs[label]))})")
    text = "; ".join(notes) + ": the intervals include the teacher-seed variance."
    for label in single:
        name = "the --results run" if not label else f"run '{label}'"
        text += f" The models of {name} have one teacher seed: for them {exclude}."
    return text


def seed_note(metrics: dict) -> str:
    """What the intervals of models of one seed (one teacher seed, one student seed) leave out, or ''."""
    single = [f"`{name}`" for name, metric in metrics.items() if len(metric.teachers) == 1]
    if not single:
        return ""
    return (
        f" Of one seed: {', '.join(single)}; its seed-to-seed variance is not sampled, so its intervals, and those of "
        "its claims, hold the rows' variance only and are too narrow for a claim about the method."
    )


def print_tables(args: argparse.Namespace, found: dict, metrics: dict, claims: dict, counts: dict) -> None:
    """The tables: the models, per domain where the rows have domains, the claims' tests. ``counts``: the rows, the
    OOD rows, the clusters and their note, the runs."""
    kind, score = args.metric
    files = {name: [paths for _, _, paths in units] for name, (_, units) in found.items()}
    what = f"{METRICS[kind]} of {score}" if score else METRICS[kind]
    if kind == "ece":
        what = f"ECE (%, {metrics[next(iter(metrics))].bins} bins)"
    of_class = f" (held-out class {args.ood_class})" if args.ood_class is not None else ""
    against = f" against {counts['ood_rows']:,} OOD rows{of_class}" if score else ""
    clusters = (
        f" in {counts['clusters']:,} clusters by {args.cluster_column!r}{counts['cluster_note']}"
        if args.cluster_column
        else ""
    )
    print(
        f"{counts['rows']:,} {args.split} rows{clusters}{against}; 95% intervals over teacher seeds, student seeds "
        "and rows (Student's t from a hierarchical bootstrap, the rows drawn 4,000 times)."
    )
    print(teacher_note(counts["runs"], {label for label, _ in found.values()}) + seed_note(metrics) + "\n")
    f1_head, f1_rule = (" macro-F1 (%) |", " ---: |") if kind == "accuracy" else ("", "")
    print(f"| model | seeds | {what} | 95% interval |{f1_head} gold labels read |")
    print(f"| --- | ---: | ---: | --- |{f1_rule} --- |")
    for model, paths in files.items():
        print(model_row(model, paths, metrics[model], kind == "accuracy", counts["cluster_labels"]))
    per_teacher = teacher_seed_table(metrics) if kind == "accuracy" else []
    if per_teacher:
        print(
            "\nAccuracy (%) per teacher seed, the mean over its student seeds; folder k: the k-th results folder of "
            "the model's run, in the order above:\n"
        )
        print("\n".join(per_teacher))
    by_domain = domain_table(files) if kind == "accuracy" else []
    if by_domain:
        print("\nAccuracy (%) per domain, mean over seeds:\n")
        print("\n".join(by_domain))
    if claims:
        lower = " (lower is better: A beats B below 0)" if kind == "ece" else ""
        rows, tests = claim_rows(claims, metrics, counts["cluster_labels"])
        print(
            f"\n| claim | A − B (points){lower} | 95% interval | test | p | Holm p | detectable (matches: "
            "confirmable margin) | verdict |"
        )
        print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- |")
        print("\n".join(rows))
        print(
            f"\nOne family of {len(claims)} claim{'s' if len(claims) > 1 else ''} and {tests} "
            f"test{'s' if tests > 1 else ''}, Holm-adjusted: a test is decided when its Holm p is below {ALPHA:g}. "
            "Detectable: the smallest difference found with 80% power; ±: the smallest margin two one-sided tests "
            "confirm with 80% power were A − B zero."
        )


def main(argv: list[str] | None = None) -> None:
    args, models, claims = arguments(argv)
    runs = {"": args.results}
    for label, folders in map(also_run, args.also):
        if label in runs:
            raise SystemExit(f"--also {label}=...: the label {label!r} is given twice")
        runs[label] = folders
    kind, score = args.metric
    found = {name: joined(runs, parts, args.split) for name, parts in models.items()}
    files = {name: [paths for _, _, paths in units] for name, (_, units) in found.items()}
    ood = {m: ood_units(runs[""], m, models[m], score, args.split, args.ood_class) for m in files} if score else {}
    rows, columns = read_rows(files, kind, score)
    bins = ece_bins(files) if kind == "ece" else 15
    check_same_split(runs, args.split)
    test_rows = same_rows(found, runs, rows, columns, args.split)
    if score:
        check_ood_rows(ood)
    ood_ids = next(iter(ood.values()))[0] if score else None
    labels, clusters, note = (
        cluster_labels(runs[""][0], args.split, args.cluster_column, test_rows, ood_ids)
        if args.cluster_column
        else (None, 0, "")
    )
    try:
        metrics = {
            model: metric_of(kind, score, columns[model], ood[model][1] if score else None, bins, found[model][1])
            for model in files
        }
    except ValueError as error:
        raise SystemExit(str(error)) from None
    counts = {
        "rows": len(test_rows), "ood_rows": 0 if ood_ids is None else len(ood_ids), "clusters": clusters,
        "cluster_note": note, "cluster_labels": labels, "runs": runs,
    }  # fmt: skip
    print_tables(args, found, metrics, claims, counts)


if __name__ == "__main__":
    main()
