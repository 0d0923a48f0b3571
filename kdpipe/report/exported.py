"""The report's table of exported students (docs/report.md, "Exported models and serving profiles"): each exported
model against the student it was made from, on the same test rows (its evaluation's ``compared_with`` block,
:func:`kdpipe.evaluation.exported.against_reference`), and the flag of an int8 model whose accuracy falls by more
than ``export.max_accuracy_drop`` (:func:`kdpipe.evaluation.exported.accuracy_drop`)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kdpipe.core.markdown import plain
from kdpipe.core.store import atomic_path
from kdpipe.evaluation.exported import accuracy_drop

EXPORTED_OUTPUTS = ("exported.tsv", "exported.md")
COLUMNS = ("model", "exported from", "precision", "split", "rows", "accuracy", "its student", "difference", "low",
           "high", "agreement", "ece difference", "flagged")  # fmt: skip


def exported_rows(records: list[dict], margin: float) -> pd.DataFrame:
    """One row per evaluation of an exported model (``exported`` in its record) that compares it with its student."""
    by_name = {(r["model"], r["split"]): r for r in records}
    rows = []
    for record in records:
        reference = record.get("compared_with")
        student = by_name.get(((reference or {}).get("model"), record["split"]))
        if not record.get("exported") or student is None:
            continue
        flag = accuracy_drop(student, record, margin=margin)
        rows.append(
            {
                "model": record["model"],
                "exported from": student["model"],
                "precision": record["exported"],
                "split": record["split"],
                "rows": flag["n"],
                "accuracy": flag["accuracy"],
                "its student": flag["reference_accuracy"],
                "difference": flag["difference"],
                "low": reference["accuracy_difference"]["low"],
                "high": reference["accuracy_difference"]["high"],
                "agreement": reference["agreement"],
                "ece difference": reference["ece_difference"]["difference"],
                "flagged": flag["flagged"] and record["exported"] == "int8",
            }
        )
    return pd.DataFrame(rows, columns=list(COLUMNS))


def flagged_lines(table: pd.DataFrame, margin: float) -> list[str]:
    """The summaries' warning of each flagged model."""
    return [
        f"{row['model']}: its accuracy on the {row['split']} rows is {100 * row['difference']:+.1f} points against its "
        f"student {row['exported from']}'s (95% paired interval {100 * row['low']:+.1f} to {100 * row['high']:+.1f}), "
        f"below export.max_accuracy_drop ({100 * margin:.1f} points)"
        for _, row in table[table["flagged"]].iterrows()
    ]


def write_exported(table: pd.DataFrame, out_dir: Path) -> None:
    """``exported.tsv`` and ``exported.md``."""
    with atomic_path(out_dir / "exported.tsv") as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
    lines = [
        "| model | exported from | precision | split | rows | accuracy (%) | its student (%) | difference, 95% paired "
        "interval (points) | agreement (%) | ECE difference | flagged |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for _, row in table.iterrows():
        lines.append(
            f"| {plain(row['model'])} | {plain(row['exported from'])} | {row['precision']} | {row['split']} | "
            f"{row['rows']:,} | {100 * row['accuracy']:.1f} | {100 * row['its student']:.1f} | "
            f"{100 * row['difference']:+.1f} [{100 * row['low']:+.1f}, {100 * row['high']:+.1f}] | "
            f"{100 * row['agreement']:.1f} | {row['ece difference']:+.3f} | {'**yes**' if row['flagged'] else 'no'} |"
        )
    with atomic_path(out_dir / "exported.md") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
