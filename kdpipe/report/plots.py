"""The report's figures: reliability diagrams, the metrics chart and the uncertainty split (matplotlib, Agg)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.report.figures import model_label, pyplot, save
from kdpipe.report.markdown import format_mean_std
from kdpipe.report.summary import UNCERTAINTY_PARTS

TEACHER_HATCH = "///"
ACCURACY_BAR_COLOUR, GAP_COLOUR = "#7FA7D6", "#C44E52"
METRIC_COLOURS = {"accuracy": "#4C72B0", "macro_f1": "#DD8452", "ece": "#55A868", "nll": "#8172B3"}
UNCERTAINTY_TITLES = {
    "total": "total (predictive entropy)", "aleatoric": "aleatoric (mean member entropy)",
    "epistemic": "epistemic (mutual information)",
}  # fmt: skip
ENSEMBLE_LINESTYLES = ("-", "--", ":", "-.")


def plot_reliability(summary: pd.DataFrame, path: Path) -> None:
    """A grid of reliability diagrams, one per model, each above a histogram of how many examples fall per bin."""
    plt = pyplot()
    n_models = len(summary)
    ncols = min(n_models, 4)
    nrows = -(-n_models // ncols)
    fig = plt.figure(figsize=(max(3.4 * ncols, 5.0), 4.4 * nrows + 0.6), layout="constrained")
    cells = fig.add_gridspec(nrows, ncols)
    for i, row in enumerate(summary.itertuples(index=False)):
        inner = cells[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=(3.2, 1), hspace=0.05)
        ax, ax_hist = fig.add_subplot(inner[0]), fig.add_subplot(inner[1])
        _draw_reliability(ax, ax_hist, row, first_column=i % ncols == 0)
    # One legend below the grid: inside a panel it would hide the bars of some model or other.
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False, fontsize=9)
    split = summary["split"].iloc[0]
    fig.suptitle(f"Reliability on the {split} split\n(bins pooled over seeds)", fontsize=12)
    save(fig, path)
    plt.close(fig)


def _draw_reliability(ax, ax_hist, row, first_column: bool) -> None:
    bins = row.reliability
    edges, count = bins["bin_edges"], bins["count"]
    left, width = edges[:-1], np.diff(edges)
    filled = count > 0
    accuracy, confidence = bins["accuracy"][filled], bins["confidence"][filled]

    ax.bar(left[filled], accuracy, width[filled], align="edge", color=ACCURACY_BAR_COLOUR, edgecolor="white",
           linewidth=0.6, label="accuracy")  # fmt: skip
    # Hatched, not filled: an under-confident bin's gap lies over its accuracy bar and must stay readable there.
    ax.bar(left[filled], confidence - accuracy, width[filled], bottom=accuracy, align="edge", facecolor="none",
           edgecolor=GAP_COLOUR, hatch="////", linewidth=0.8, label="gap to mean confidence")  # fmt: skip
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.3", linewidth=1, label="perfect calibration")
    ece = format_mean_std(row.ece, row.ece_std, 3)
    ax.set_title(f"{model_label(row)}\nECE = {ece}", fontsize=10)
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.tick_params(labelbottom=False, labelsize=8)
    ax.grid(alpha=0.3, linewidth=0.5)

    ax_hist.bar(left, 100 * count / count.sum(), width, align="edge", color="0.55", edgecolor="white",
                linewidth=0.6)  # fmt: skip
    ax_hist.set(xlim=(0, 1))
    ax_hist.set_xlabel("confidence (max probability)", fontsize=9)
    ax_hist.tick_params(labelsize=8)
    ax_hist.grid(axis="y", alpha=0.3, linewidth=0.5)
    if first_column:
        ax.set_ylabel("accuracy", fontsize=9)
        ax_hist.set_ylabel("% examples", fontsize=9)


def plot_metrics(summary: pd.DataFrame, path: Path) -> None:
    """Horizontal grouped bars per model: accuracy and macro-F1, ECE, NLL; error bars are the seed std."""
    plt = pyplot()
    from matplotlib.patches import Patch

    n_models = len(summary)
    fig, axes = plt.subplots(
        1, 3, figsize=(14, 1.6 + 0.75 * n_models), sharey=True, layout="constrained",
        gridspec_kw={"width_ratios": (1.6, 1, 1)},
    )  # fmt: skip
    y = np.arange(n_models)
    teacher = (summary["kind"] == "teacher").to_numpy()
    panels = (
        (axes[0], (("accuracy", -0.2), ("macro_f1", 0.2)), 100, "{:.1f}", "accuracy and macro-F1 (%) ↑"),
        (axes[1], (("ece", 0.0),), 1, "{:.3f}", "ECE ↓"),
        (axes[2], (("nll", 0.0),), 1, "{:.3f}", "NLL (nats) ↓"),
    )
    for ax, metrics, scale, fmt, title in panels:
        height = 0.8 / len(metrics)
        for metric, offset in metrics:
            values = scale * summary[metric].to_numpy()
            errors = scale * summary[f"{metric}_std"].to_numpy()
            _hbars(ax, y + offset, values, errors, height * 0.92, METRIC_COLOURS[metric], teacher, fmt)
        ax.set_title(title, fontsize=11)
        low = _lower_limit(summary, metrics, scale) if scale == 100 else 0.0
        ax.set_xlim(low, _upper_limit(summary, metrics, scale, low))
        if scale == 100:  # the room for the values written after the bars is not a percentage beyond 100
            ax.set_xticks([t for t in ax.get_xticks() if low <= t <= 100])
        ax.grid(axis="x", alpha=0.3, linewidth=0.5)
        ax.tick_params(labelsize=9)
    axes[0].set_yticks(y, [model_label(row) for row in summary.itertuples(index=False)], fontsize=9)
    axes[0].invert_yaxis()

    handles = [Patch(color=METRIC_COLOURS[m], label=label) for m, label in
               (("accuracy", "accuracy"), ("macro_f1", "macro-F1"), ("ece", "ECE"), ("nll", "NLL"))]  # fmt: skip
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch=TEACHER_HATCH, label="teacher (own classes)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=9)
    split = summary["split"].iloc[0]
    seeds = " (error bars: std over seeds)" if (summary["seeds"] > 1).any() else ""
    fig.suptitle(f"Models on the {split} split{seeds}", fontsize=13)
    save(fig, path)
    plt.close(fig)


def _hbars(ax, y, values, errors, height, colour, teacher, fmt) -> None:
    """Bars with teachers hatched, error bars where a std exists, and the value written after each bar."""
    bars = ax.barh(y, values, height, color=colour, edgecolor="white", linewidth=0.6)
    for bar, is_teacher in zip(bars, teacher):
        if is_teacher:
            bar.set_hatch(TEACHER_HATCH)
    has_std = ~np.isnan(errors)
    ax.errorbar(values[has_std], y[has_std], xerr=errors[has_std], fmt="none", ecolor="0.15", capsize=3,
                linewidth=1)  # fmt: skip
    for yi, value, error in zip(y, values, np.nan_to_num(errors)):
        ax.annotate(fmt.format(value), (value + error, yi), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)  # fmt: skip


def _lower_limit(summary: pd.DataFrame, metrics, scale: float) -> float:
    """Where a percentage axis starts: 10 points below the lowest bar, on a multiple of 10 (from 0, differences of
    a few points between 85% and 90% would be a sliver)."""
    low = min(scale * (summary[m] - summary[f"{m}_std"].fillna(0)).min() for m, _ in metrics)
    return float(max(0.0, np.floor(low / 10) * 10 - 10))


def _upper_limit(summary: pd.DataFrame, metrics, scale: float, low: float = 0.0) -> float:
    """Room to the right of the longest bar (plus its error) for the value written after it: 18% of the axis."""
    ends = [scale * (summary[m] + summary[f"{m}_std"].fillna(0)).max() for m, _ in metrics]
    return (low + (max(ends) - low) * 1.18) or 1.0


def plot_uncertainty(summary: pd.DataFrame, path: Path) -> None:
    """Three panels (total, aleatoric, epistemic): each model's histogram of per-example uncertainty as a density
    step line, seeds pooled, ensembles thick and black; legends give the table's TV distance to the reference."""
    plt = pyplot()
    shown = summary[summary["uncertainty"].notna()]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.0 + 0.2 * len(shown)), layout="constrained")
    styles = _uncertainty_styles(shown["kind"])
    for ax, part in zip(axes, UNCERTAINTY_PARTS):
        for row, style in zip(shown.itertuples(index=False), styles):
            edges, counts = row.uncertainty["bin_edges"], row.uncertainty["hist"][part]
            ax.stairs(counts / (counts.sum() * np.diff(edges)), edges, label=_tv_label(row, part), **style)
        ax.set_xlim(0, _occupied_limit(shown, part))
        ax.set_title(UNCERTAINTY_TITLES[part], fontsize=11)
        ax.set_xlabel("nats", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, linewidth=0.5)
        # Below the panel: the labels differ per panel (their TV), and inside it they would hide the lines.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False, fontsize=8)
    axes[0].set_ylabel("density", fontsize=9)
    split = shown["split"].iloc[0]
    fig.suptitle(
        f"Uncertainty on the {split} split (seeds pooled; TV: total variation distance to the reference ensemble's "
        "histogram, mean ± std over seeds)", fontsize=12,
    )  # fmt: skip
    save(fig, path)
    plt.close(fig)


def _uncertainty_styles(kinds: pd.Series) -> list[dict]:
    """Line styles in row order: ensembles thick and black (solid, then dashed... if several), others coloured."""
    styles, ensembles, others = [], 0, 0
    for kind in kinds:
        if kind == "ensemble":
            linestyle = ENSEMBLE_LINESTYLES[ensembles % len(ENSEMBLE_LINESTYLES)]
            styles.append({"color": "black", "linewidth": 2.6, "linestyle": linestyle, "zorder": 3})
            ensembles += 1
        else:
            styles.append({"color": f"C{others % 10}", "linewidth": 1.5})
            others += 1
    return styles


def _tv_label(row, part: str) -> str:
    """The model's name with its TV distance to the reference ensemble (mean ± std over seeds) where it has one."""
    tv = getattr(row, f"tv_{part}")
    return row.model if pd.isna(tv) else f"{row.model} (TV {format_mean_std(tv, getattr(row, f'tv_{part}_std'), 2)})"


def _occupied_limit(summary: pd.DataFrame, part: str) -> float | None:
    """The right edge of the last bin any model fills (None: automatic), so that epistemic values, which crowd
    into the first of the bins up to log C, are not squeezed against the axis."""
    ends = [u["bin_edges"][1:][u["hist"][part] > 0].max(initial=0.0) for u in summary["uncertainty"]]
    return max(ends) or None
