"""What a model costs against what it gets right: accuracy against parameters and against measured inference time
per example, teachers and students together, the Pareto front marked (the reason to distil is to move down the
cost axis without falling off the front). Where a model has a serving profile (kdpipe.report.serving), its time is
its batch-1 median latency instead."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.report.figures import pyplot, save
from kdpipe.report.summary import comparable

COSTS = (("params", "parameters"), ("inference_ms", "inference time per example (ms)"))
TITLE_WIDTH = 170  # characters of the title per line (a title that names where latencies were profiled wraps)


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
    """Two panels, accuracy against parameters and against inference time per example; the front through the
    comparable models only (:func:`comparable`), the others hollow."""
    plt = pyplot()
    full = comparable(summary)
    fig, axes = plt.subplots(1, 2, figsize=(14, 5.2), layout="constrained")
    accuracy = 100 * summary["accuracy"].to_numpy(dtype=float)
    for ax, (column, label) in zip(axes, COSTS):
        cost = summary[column].to_numpy(dtype=float)
        _cost_axis(ax, cost, column)
        ax.set_ylim(*_accuracy_limits(accuracy))
        names = list(summary["model"])
        if column == "inference_ms":
            label, names = _time_axis(summary, label)
        places = _label_places(ax, cost, accuracy, names, 6.3, 4.2)
        for i, row in enumerate(summary.itertuples(index=False)):
            if not np.isfinite(cost[i]):
                continue
            marker = {"teacher": "s", "ensemble": "D", "oracle": "*"}.get(row.kind, "o")
            colour = f"C{i % 10}"
            ax.scatter(cost[i], accuracy[i], s=70, marker=marker, zorder=3, linewidths=1.5,
                       facecolors=colour if full[i] else "none", edgecolors=colour)  # fmt: skip
            ax.annotate(names[i], (cost[i], accuracy[i]), xytext=places[i], fontsize=8,
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
    title = (f"Cost against accuracy on the {split} split ({_measured_on(summary)}; hollow: not comparable, a "
             "teacher scored on its own classes or the teachers' oracle)")  # fmt: skip
    fig.suptitle(textwrap.fill(title, TITLE_WIDTH), fontsize=11)
    save(fig, path)
    plt.close(fig)


def _label_places(ax, cost: np.ndarray, accuracy: np.ndarray, names: list[str], width_in: float, height_in: float):
    """Where each point's label goes, in data coordinates: right of its point, moved down (then up) a label height
    at a time until its box, estimated from the axes' size in inches (8-point text), overlaps no marker and no label
    placed before it (the most accurate point first): close points would print their names over each other."""
    to_axes, to_data = ax.transLimits, ax.transLimits.inverted()
    char_w, line_h = 0.075 / width_in, 0.16 / height_in
    shown = np.flatnonzero(np.isfinite(cost) & np.isfinite(accuracy))
    points = {i: to_axes.transform((cost[i], accuracy[i])) for i in shown}
    radius_x, radius_y = 0.07 / width_in, 0.07 / height_in  # a marker, as an obstacle to the labels
    placed = [(x - radius_x, x + radius_x, y - radius_y, y + radius_y) for x, y in points.values()]
    out = [(np.nan, np.nan)] * len(names)
    for i in sorted(shown, key=lambda i: -accuracy[i]):
        x, y = points[i]
        x0, x1 = x + 0.02, x + 0.02 + char_w * len(names[i])
        for step in [0, *[s for k in range(1, 12) for s in (-k, k)]]:
            y0 = y + step * line_h - line_h / 2
            if not any(x0 < bx1 and bx0 < x1 and y0 < by1 and by0 < y0 + line_h for bx0, bx1, by0, by1 in placed):
                break
        placed.append((x0, x1, y0, y0 + line_h))
        out[i] = tuple(to_data.transform((x0, y0 + line_h / 2)))
    return out


def _accuracy_limits(accuracy: np.ndarray) -> tuple[float, float]:
    """The accuracy axis around the points, with room above the best one for its label."""
    finite = accuracy[np.isfinite(accuracy)]
    if not len(finite):
        return 0.0, 100.0
    span = max(np.ptp(finite), 2.0)
    return finite.min() - 0.06 * span, finite.max() + 0.08 * span


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


def _time_axis(summary: pd.DataFrame, label: str) -> tuple[str, list[str]]:
    """The time axis's label and the points' names: batch-1 latency where every model has a serving profile; where
    only some have, the others (their inference time per example at evaluation) marked with a dagger."""
    names = list(summary["model"])
    if "time_source" not in summary or not (summary["time_source"] == "profile").any():
        return label, names
    if (summary["time_source"] == "profile").all():
        return "batch-1 latency, median (ms; serving profiles)", names
    names = [n if s == "profile" else f"{n} †" for n, s in zip(names, summary["time_source"])]
    return "batch-1 latency, median (ms); †: inference time per example at evaluation", names


def _measured_on(summary: pd.DataFrame) -> str:
    """Where the inference times were measured, as the evaluations (and the serving profiles) recorded it."""
    if "time_source" in summary and (summary["time_source"] == "profile").any():
        profiled = sorted(set(summary.loc[summary["time_source"] == "profile", "profile_device"].dropna()))
        rest = summary[summary["time_source"] != "profile"]
        evaluated = f"; † {_measured_on(rest.drop(columns='time_source'))}" if len(rest) else ""
        return f"latency profiled on {' / '.join(profiled)}{evaluated}"
    devices = sorted(set(summary["device"].dropna()))
    batches = sorted({int(b) for b in summary["batch_size"].dropna()})
    if not devices:
        return "inference times as recorded"
    batch = f", batch size {', '.join(map(str, batches))}" if batches else ""
    return f"inference on {' / '.join(devices)}{batch}"
