"""What a model costs against what it gets right: accuracy against parameters and against measured inference time
per example, teachers and students together, the Pareto front marked (the reason to distil is to move down the
cost axis without falling off the front)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.report.summary import comparable

COSTS = (("params", "parameters"), ("inference_ms", "inference time per example (ms)"))


def pareto_front(cost: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats (cheaper or as cheap, and more accurate or as accurate, one of
    the two strictly), by increasing cost."""
    order = np.lexsort((-accuracy, cost))  # by cost, the more accurate first among equal costs
    front, best = [], -np.inf
    for i in order:
        if np.isfinite(cost[i]) and np.isfinite(accuracy[i]) and accuracy[i] > best:
            front.append(i)
            best = accuracy[i]
    return np.array(front, dtype=int)


def plot_cost(summary: pd.DataFrame, path: Path) -> None:
    """Two panels, accuracy against parameters and against inference time per example (log scales when the costs
    span more than a factor 10). The front is drawn through the comparable models only (:func:`comparable`): a
    subset teacher and the teachers' oracle are drawn hollow and kept off it."""
    from kdpipe.report.plots import _pyplot, _save

    plt = _pyplot()
    full = comparable(summary)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2), layout="constrained")
    accuracy = 100 * summary["accuracy"].to_numpy(dtype=float)
    for ax, (column, label) in zip(axes, COSTS):
        cost = summary[column].to_numpy(dtype=float)
        _cost_axis(ax, cost, column)
        label_y, label_x = _spread_labels(cost, accuracy), _nudged(ax, cost)
        for i, row in enumerate(summary.itertuples(index=False)):
            if not np.isfinite(cost[i]):
                continue
            marker = {"teacher": "s", "ensemble": "D", "oracle": "*"}.get(row.kind, "o")
            colour = f"C{i % 10}"
            ax.scatter(cost[i], accuracy[i], s=70, marker=marker, zorder=3, linewidths=1.5,
                       facecolors=colour if full[i] else "none", edgecolors=colour)  # fmt: skip
            ax.annotate(row.model, (cost[i], accuracy[i]), xytext=(label_x[i], label_y[i]), fontsize=8,
                        va="center", arrowprops={"arrowstyle": "-", "color": "0.6", "linewidth": 0.6})  # fmt: skip
        front = np.flatnonzero(full)[pareto_front(cost[full], accuracy[full])]
        if len(front) > 1:
            ax.step(cost[front], accuracy[front], where="post", color="0.35", linestyle="--", linewidth=1,
                    label="Pareto front (full label space)", zorder=2)  # fmt: skip
            ax.legend(loc="lower right", frameon=False, fontsize=8)
        ax.set_xlabel(label, fontsize=10)
        ax.set_ylabel("accuracy (%)", fontsize=10)
        ax.grid(alpha=0.3, linewidth=0.5, which="both")
        ax.tick_params(labelsize=8)
    split = summary["split"].iloc[0]
    fig.suptitle(f"Cost against accuracy on the {split} split ({_measured_on(summary)}; hollow: not comparable, a "
                 "teacher scored on its own classes or the teachers' oracle)", fontsize=11)  # fmt: skip
    _save(fig, path)
    plt.close(fig)


def _spread_labels(cost: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """The height of each point's label: models of about the same cost (within 10%) often have close accuracies
    (students of one architecture), so their labels are pushed apart to at least 4% of the accuracy range."""
    finite = np.isfinite(cost) & np.isfinite(accuracy)
    y = accuracy.copy()
    gap = 0.04 * max(np.ptp(accuracy[finite]) if finite.any() else 0.0, 1.0)
    groups: list[list[int]] = []
    for i in np.flatnonzero(finite)[np.argsort(cost[finite])]:
        if groups and cost[i] <= 1.1 * cost[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    for group in groups:
        order = sorted(group, key=lambda i: accuracy[i])
        for below, above in zip(order, order[1:]):
            y[above] = max(y[above], y[below] + gap)
        shift = (y[order].mean() - accuracy[order].mean()) if len(order) > 1 else 0.0
        y[order] -= shift  # centred on the points, not stacked above them
    return y


def _nudged(ax, cost: np.ndarray) -> np.ndarray:
    """Where labels start: 2% of the axis width right of their points (in log space on a log axis)."""
    low, high = ax.get_xlim()
    if ax.get_xscale() == "log":
        return cost * (high / low) ** 0.02
    return cost + 0.02 * (high - low)


def _cost_axis(ax, cost: np.ndarray, column: str) -> None:
    """Log scale when the costs span more than a factor 10; parameters in millions; room on the right for labels."""
    finite = cost[np.isfinite(cost)]
    if not len(finite):
        return
    low, high = finite.min(), finite.max()
    if high > 10 * low:
        ax.set_xscale("log")
        ax.set_xlim(low / 1.3, high * 2.0)
    else:
        span = max(high - low, 0.05 * high)
        ax.set_xlim(low - 0.1 * span, high + 0.45 * span)
    if column == "params":
        from matplotlib.ticker import FuncFormatter

        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M"))


def _measured_on(summary: pd.DataFrame) -> str:
    """Where the inference times were measured, as the evaluations recorded it."""
    devices = sorted(set(summary["device"].dropna()))
    batches = sorted({int(b) for b in summary["batch_size"].dropna()})
    if not devices:
        return "inference times as recorded"
    batch = f", batch size {', '.join(map(str, batches))}" if batches else ""
    return f"inference on {' / '.join(devices)}{batch}"
