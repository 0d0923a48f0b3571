"""The report's figures of out-of-distribution detection and selective prediction: ``ood_roc.png`` and
``risk_coverage.png``, one line per base model (its first seed's curve), the models that do not compete
(:func:`kdpipe.report.summary.comparable`) dashed.

See docs/report.md, "Out-of-distribution detection and selective prediction".
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.report.figures import placeholder, pyplot, save
from kdpipe.report.markdown import format_mean_std
from kdpipe.report.ood import curve_score, ood_notes
from kdpipe.report.summary import comparable

# The risk axis is fitted to the curves from this coverage on: below it a handful of rows make the risk jump (the one
# most confident row wrong is a risk of 100%).
FIT_FROM_COVERAGE = 0.05
# Characters per title line: about what fits across the 8-inch figures at 10 points.
TITLE_WIDTH = 100


def plot_ood_roc(table: pd.DataFrame, path: Path, order: list[str] = ()) -> None:
    """ROC curves of the OOD rows, one per model of the OOD ``table`` for its :func:`curve_score`, with the chance
    diagonal; a model's colour is that of its place in ``order`` (the summary's models, as in risk_coverage.png)."""
    if all(curve_score(row) is None for row in table.to_dict("records")):
        placeholder(path, "No OOD scores: " + "; ".join(ood_notes(table)[1]))
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 6.4), layout="constrained")
    ax.plot([0, 1], [0, 1], linestyle=":", color="0.5", linewidth=1, label="chance (AUROC 0.5)")
    colours = {model: i for i, model in enumerate([*order, *(m for m in table["model"] if m not in order)])}
    for row, full in zip(table.to_dict("records"), comparable(table)):
        score = curve_score(row)
        if score is None:
            continue
        roc = row["roc"][score]
        i = colours[row["model"]]
        auroc = format_mean_std(row[f"{score}_auroc"], row[f"{score}_auroc_std"], 3)
        ax.plot(roc["fpr"], roc["tpr"], color=f"C{i % 10}", linestyle="-" if full else "--", linewidth=1.6,
                label=f"{row['model']} · {score} (AUROC {auroc})")  # fmt: skip
    ax.set(xlim=(0, 1), ylim=(0, 1.01))
    _axes(
        ax, "false positive rate (in-distribution rows flagged)", "true positive rate (OOD rows flagged)", "lower right"
    )
    _title(
        ax, ood_notes(table)[0], "ROC of each model's epistemic score (else entropy); first seed's curve, AUROC mean ± "
        "std over seeds; dashed: a subset teacher (not comparable)",
    )  # fmt: skip
    save(fig, path)
    plt.close(fig)


def plot_risk_coverage(runs: pd.DataFrame, summary: pd.DataFrame, path: Path) -> None:
    """Risk–coverage curves (``metrics.selective.curve``) of the models of ``summary`` (one split), from the first
    seed of each in ``runs``, the legend with the AURC of the curve's score over seeds."""
    split = summary["split"].iloc[0]
    lines = []
    for i, (row, full) in enumerate(zip(summary.itertuples(index=False), comparable(summary))):
        seeds = runs[(runs["base"] == row.model) & (runs["split"] == split) & runs["selective"].notna()]
        if len(seeds):
            curve = seeds["selective"].iloc[0]["curve"]
            aurc = pd.Series([s["aurc"].get(curve["score"]) for s in seeds["selective"]], dtype=float)
            lines.append((i, row.model, curve, aurc, full))
    if not lines:
        placeholder(path, f"No risk–coverage curve: the evaluations of the {split} split have no selective-prediction "
                          "metrics (re-run evaluate)")  # fmt: skip
        return
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.6), layout="constrained")
    scores = list(dict.fromkeys(curve["score"] for _, _, curve, _, _ in lines))
    top = 0.0
    for i, model, curve, aurc, full in lines:  # i: the model's place in the summary, its colour
        coverage, risk = np.asarray(curve["coverage"], float), np.asarray(curve["risk"], float)
        named = f" · {curve['score']}" if len(scores) > 1 else ""
        ax.plot(100 * coverage, 100 * risk, color=f"C{i % 10}", linestyle="-" if full else "--", linewidth=1.6,
                label=f"{model}{named} (AURC {format_mean_std(aurc.mean(), aurc.std(ddof=1), 4)})")  # fmt: skip
        fitted = risk[coverage >= FIT_FROM_COVERAGE]
        top = max(top, fitted.max() if len(fitted) else risk.max())
    ax.set(xlim=(0, 100), ylim=(0, max(100 * top * 1.15, 1.0)))
    _axes(
        ax, "coverage (% of rows kept, the most confident first)", "risk (% errors among the kept rows)", "upper left"
    )
    _title(
        ax, f"Selective prediction on the {split} split: confidence by {' / '.join(scores)}; first seed's curve, AURC "
        f"mean ± std over seeds (lower is better)", f"risk axis fitted from {FIT_FROM_COVERAGE:.0%} coverage; dashed: "
        "a subset teacher or the teachers' oracle (not comparable)",
    )  # fmt: skip
    save(fig, path)
    plt.close(fig)


def _title(ax, *parts: str) -> None:
    """The figure's title, each part wrapped at TITLE_WIDTH characters (the OOD rows' description may be long)."""
    ax.set_title("\n".join(textwrap.fill(part, TITLE_WIDTH) for part in parts), fontsize=10)


def _axes(ax, xlabel: str, ylabel: str, legend: str) -> None:
    """The labels, grid, ticks and legend both OOD figures share."""
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.grid(alpha=0.3, linewidth=0.5)
    ax.tick_params(labelsize=8)
    ax.legend(loc=legend, fontsize=8, framealpha=0.9)
