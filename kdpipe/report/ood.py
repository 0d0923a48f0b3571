"""The report's out-of-distribution (OOD) table, from each model's ``ood.json``: how well each uncertainty score
tells the OOD rows from the in-distribution rows, as ``ood.tsv`` and ``ood.md`` (summary.html and the landing page
show it too, kdpipe.report.html). See docs/report.md, "Out-of-distribution detection and selective prediction".

A row is one base model, its seeds as mean and sample std like the summary's; a model without scores (the teachers'
oracle) is kept with its ``reason``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError, atomic_path
from kdpipe.report.markdown import format_mean_std, markdown_table, plain, text
from kdpipe.report.summary import KIND_ORDER

OOD_SPLIT = "ood"
# Scores in the order the tables show them; a score the evaluations name beyond these follows in input order.
SCORE_ORDER = (
    "max_prob", "entropy", "expected_entropy", "mutual_info",
    "mc_max_prob", "mc_entropy", "mc_expected_entropy", "mc_mutual_info",
)  # fmt: skip
# The epistemic score a model is judged by on the landing page and in ood_roc.png: its own members' or heads'
# mutual information, else that of its MC-dropout samples.
EPISTEMIC = ("mutual_info", "mc_mutual_info")
# Detection metrics: higher is better for AUROC and AUPR, lower for the FPR at 95% TPR.
DETECTION = {"auroc": "AUROC", "aupr": "AUPR", "fpr95": "FPR@95"}
LOWER_IS_BETTER = {"fpr95"}
REQUIRED_FIELDS = ("model", "base", "kind", "split", "classes", "ood")
REQUIRED_OOD = ("source", "in_split", "n_in", "n_ood", "accuracy_in")
TSV_HEAD = ("model", "kind", "method", "seeds", "classes", "ood_rows", "in_split", "n_in", "n_ood", "accuracy_in",
            "accuracy_in_std")  # fmt: skip
MARKDOWN_HEAD = ("model", "kind", "method", "seeds", "classes", "rows in / OOD", "accuracy in (%)")
OOD_NOTE = (
    "How well each uncertainty score tells the OOD rows (positives) from the in-distribution rows, one row per "
    "model (mean ± sample standard deviation over seeds). AUROC: the chance that a random OOD row scores as less "
    "sure than a random in-distribution row (0.5 = chance, 1 = perfect; higher is better). AUPR: average precision "
    "with the OOD rows as the positive class (higher is better; chance is the OOD share of the rows). FPR@95: the "
    "share of in-distribution rows flagged when 95% of the OOD rows are (lower is better). Scores: max_prob (the "
    "maximum probability, low = OOD), entropy (of the mean prediction, total uncertainty), expected_entropy (mean "
    "entropy of the members or heads, aleatoric), mutual_info (their difference, epistemic); mc_: the same from "
    "MC-dropout samples. Accuracy in: on the in-distribution rows."
)


def check_ood(record: dict, path: str | Path) -> dict:
    """``record``, the ``ood.json`` read from ``path``, checked for every field the report uses, with its source."""
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    ood = record.get("ood")
    if isinstance(ood, dict):
        if "scores" not in ood:
            missing.append("ood.scores")
        elif ood["scores"] is None:
            missing += [] if ood.get("reason") else ["ood.reason"]
        else:
            missing += [f"ood.{f}" for f in REQUIRED_OOD if ood.get(f) is None]
            for score, figures in ood["scores"].items():
                missing += [f"ood.scores.{score}.{f}" for f in (*DETECTION, "roc") if (figures or {}).get(f) is None]
                roc = (figures or {}).get("roc")
                if isinstance(roc, dict):
                    missing += [f"ood.scores.{score}.roc.{f}" for f in ("fpr", "tpr") if roc.get(f) is None]
    elif "ood" in record:
        missing.append("ood (an object)")
    if missing:
        raise KdpipeError(f"{path}: OOD evaluation lacks field(s) {', '.join(missing)}; re-run its evaluate job")
    return {**record, "source": str(path)}


def ood_table(records: list[dict]) -> pd.DataFrame:
    """One row per base model of the checked ``records``: per score (:data:`SCORE_ORDER`) ``<score>_<metric>`` and
    its ``_std``, in-distribution accuracy, row counts, what the OOD rows are, the ``reason`` of a model without
    scores, and ``roc``: per score, the first seed's ROC curve; ordered by kind (:data:`KIND_ORDER`), then input."""
    seen = {}
    for record in records:
        if record["model"] in seen:
            raise KdpipeError(
                f"report: model '{record['model']}' on split '{OOD_SPLIT}' is given more than once: "
                f"{seen[record['model']]}, {record['source']}"
            )
        seen[record["model"]] = record["source"]
    named = [s for r in records for s in (r["ood"]["scores"] or {})]
    scores = [s for s in SCORE_ORDER if s in named] + list(dict.fromkeys(s for s in named if s not in SCORE_ORDER))
    total_classes = max(len(r["classes"]) for r in records)
    bases = {}
    for record in records:
        bases.setdefault(record["base"], []).append(record)
    rows = [_base_row(base, group, scores, total_classes) for base, group in bases.items()]
    table = pd.DataFrame(rows)
    rank = table["kind"].map(lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER))
    return table.loc[rank.sort_values(kind="stable").index].reset_index(drop=True)


def _base_row(base: str, group: list[dict], scores: list[str], total_classes: int) -> dict:
    """The table row of the seeds ``group`` of model ``base``."""
    for field in ("kind", "method"):
        values = {r.get(field) for r in group}
        if len(values) > 1:
            raise KdpipeError(
                f"report: models {', '.join(r['model'] for r in group)} share the base name '{base}' but differ in "
                f"'{field}' ({', '.join(map(str, values))})"
            )
    scored = [r for r in group if r["ood"]["scores"] is not None]
    first = group[0]
    row = {
        "model": base, "kind": first["kind"], "method": first.get("method"), "seeds": len(group),
        "n_classes": len(first["classes"]), "classes": f"{len(first['classes'])}/{total_classes}",
        "ood_rows": " / ".join(dict.fromkeys(describe_ood_rows(r["ood"]) for r in scored)) or None,
        "in_split": " / ".join(dict.fromkeys(str(r["ood"]["in_split"]) for r in scored)) or None,
    }  # fmt: skip
    for column in ("n_in", "n_ood", "accuracy_in"):
        values = pd.Series([r["ood"][column] for r in scored], dtype=float)
        row[column], row[f"{column}_std"] = values.mean(), values.std(ddof=1)
    for score in scores:
        for metric in DETECTION:
            values = pd.Series([r["ood"]["scores"][score][metric] for r in scored if score in r["ood"]["scores"]],
                               dtype=float)  # fmt: skip
            row[f"{score}_{metric}"], row[f"{score}_{metric}_std"] = values.mean(), values.std(ddof=1)
    row["reason"] = None if scored else first["ood"]["reason"]
    row["roc"] = {s: next(r["ood"]["scores"][s]["roc"] for r in scored if s in r["ood"]["scores"])
                  for s in scores if any(s in r["ood"]["scores"] for r in scored)}  # fmt: skip
    row["sources"] = [r["source"] for r in group]
    return row


def describe_ood_rows(ood: dict) -> str:
    """What the OOD rows are, in words: "held-out classes entertainment, tech" or "file data/ood.csv"."""
    if ood.get("source") == "classes":
        classes = list(ood.get("classes") or ())
        return f"held-out class{'es' if len(classes) > 1 else ''} {', '.join(map(str, classes))}"
    if ood.get("source") == "file":
        return f"file {ood.get('file')}"
    return str(ood.get("source"))


def table_scores(table: pd.DataFrame) -> list[str]:
    """The scores the table has columns for, in its column order."""
    return [c.removesuffix("_auroc") for c in table.columns if c.endswith("_auroc") and not c.endswith("_std")]


def epistemic_score(row: dict) -> str | None:
    """The model's epistemic score (:data:`EPISTEMIC`), the first it has an AUROC for; None when it has none (a
    single model without MC-dropout samples)."""
    return next((s for s in EPISTEMIC if pd.notna(row.get(f"{s}_auroc", np.nan))), None)


def curve_score(row: dict) -> str | None:
    """The score whose ROC curve ood_roc.png draws for the model: its epistemic score, else the entropy, else the
    maximum probability (None: the model has no scores)."""
    return epistemic_score(row) or next((s for s in ("entropy", "max_prob") if s in (row.get("roc") or {})), None)


def tsv_columns(table: pd.DataFrame) -> list[str]:
    """The columns of ood.tsv: the models, then AUROC, AUPR and FPR@95 of each score (with their std), then the
    reason of a model without scores."""
    metrics = [f"{s}_{m}{std}" for s in table_scores(table) for m in DETECTION for std in ("", "_std")]
    return [*TSV_HEAD, *metrics, "reason"]


def ood_cells(row: dict, scores: list[str]) -> list[str]:
    """The cells of one model: names, counts, in-distribution accuracy, then each score's detection metrics."""
    counts = "—" if pd.isna(row["n_in"]) else f"{_count(row['n_in'])} / {_count(row['n_ood'])}"
    cells = [
        str(row["model"]), str(row["kind"]), text(row["method"]), str(row["seeds"]), str(row["classes"]), counts,
        format_mean_std(row["accuracy_in"], row["accuracy_in_std"], 1, scale=100),
    ]  # fmt: skip
    cells += [format_mean_std(row[f"{s}_{m}"], row[f"{s}_{m}_std"], 3) for s in scores for m in DETECTION]
    return cells


def _count(value: float) -> str:
    """A row count, a mean over seeds: whole when the seeds agree (as they do on one split)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def ood_notes(table: pd.DataFrame) -> tuple[str, list[str]]:
    """What the OOD rows and the in-distribution rows are (one sentence), and a line per model without scores."""
    rows = " / ".join(dict.fromkeys(table["ood_rows"].dropna())) or "—"
    splits = " / ".join(dict.fromkeys(table["in_split"].dropna())) or "—"
    sentence = f"OOD rows: {rows}. In-distribution rows: the {splits} split."
    unscored = [f"{row.model}: {row.reason}" for row in table.itertuples(index=False) if pd.notna(row.reason)]
    return sentence, unscored


def ood_markdown(table: pd.DataFrame, title: str = "Out-of-distribution detection") -> str:
    """ood.md: the notes, the table (one row per model with scores), and the models without scores with their
    reason; names from the data and the config as plain text, as in summary.md."""
    sentence, unscored = ood_notes(table)
    scores = table_scores(table)
    header = (*MARKDOWN_HEAD, *(f"{s} {name}" for s in scores for name in DETECTION.values()))
    rows = [ood_cells(row, scores) for row in table.to_dict("records") if pd.isna(row["reason"])]
    parts = [f"# {plain(title)}\n", f"{plain(sentence)}\n", f"{OOD_NOTE}\n"]
    if rows:
        parts.append(markdown_table(header, rows))
    if unscored:
        parts.append("\nNo OOD scores:\n\n" + "\n".join(f"- {plain(line)}" for line in unscored))
    return "\n".join(parts) + "\n"


def write_ood(table: pd.DataFrame, out_dir: Path) -> None:
    """ood.tsv (every column, a model without scores with its reason) and ood.md in ``out_dir``."""
    with atomic_path(out_dir / "ood.tsv") as tmp:
        table[tsv_columns(table)].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    with atomic_path(out_dir / "ood.md") as tmp:
        tmp.write_text(ood_markdown(table))
