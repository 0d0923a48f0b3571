"""The report's transfer curve (docs/report.md, "Category *Summary*"): test accuracy against the number of unlabelled
transfer rows a student learnt from, one line per method (mean ± sample std over seeds at each size), beside the
students that read no transfer row (the supervised baseline on the same gold labels) as horizontal bands. Drawn when
some student learnt from transfer rows (``transfer.png``)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kdpipe.report.figures import placeholder, pyplot, save


def plot_transfer(runs: pd.DataFrame, split: str, path: Path) -> None:
    """``transfer.png`` from the per-seed rows of ``runs`` (:func:`kdpipe.report.summary.runs_table`) on ``split``."""
    students = runs[(runs["kind"] == "student") & (runs["split"] == split)]
    learners = students.groupby("method")["transfer_rows"].transform("max") > 0
    curves, bands = students[learners], students[~learners]
    if curves.empty:
        placeholder(path, "every student learnt from 0 transfer rows (a share of the transfer rows rounds to 0)")
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for label, rows in _lines(curves):
        points = rows.groupby("transfer_rows")["accuracy"].agg(["mean", "std"]).sort_index()
        ax.errorbar(points.index, points["mean"], yerr=points["std"].fillna(0), marker="o", capsize=3, label=label)
    greys = ("0.2", "0.5", "0.7")  # the baselines in greys, apart from the curves' colours
    for k, (base, rows) in enumerate(bands.groupby("base", sort=False)):
        mean = rows["accuracy"].mean()
        std = rows["accuracy"].std(ddof=1) if len(rows) > 1 else 0.0
        colour = greys[k % len(greys)]
        ax.axhline(mean, linestyle="--", color=colour, label=f"{base} ({rows['method'].iloc[0]}): no transfer rows")
        ax.axhspan(mean - std, mean + std, color=colour, alpha=0.12)
    ax.set_xlabel("unlabelled transfer rows the student learnt from")
    ax.set_ylabel(f"{split} accuracy (mean ± std over seeds)")
    ax.set_title("Accuracy against transfer rows")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=9)
    save(fig, path)
    plt.close(fig)


def _lines(curves: pd.DataFrame):
    """(label, rows) of each line: one per method, or one per student when two students of a method (other
    settings) learnt from the same number of transfer rows, so that no point averages two kinds of student."""
    for method, rows in curves.groupby("method", sort=False):
        if rows.groupby("transfer_rows")["base"].nunique().max() > 1:
            yield from ((f"{base} ({method})", group) for base, group in rows.groupby("base", sort=False))
        else:
            yield method, rows
