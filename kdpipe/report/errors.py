"""Where the models err: accuracy per class beside the teachers' on their own classes (a table), and a row-normalised
confusion matrix per model (a figure), both from the evaluations of the plotted split. The seeds of a model are
pooled; a teacher of a subset of the classes has the rows and predictions of its own classes only."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError
from kdpipe.report.figures import model_label, placeholder, pyplot, save
from kdpipe.report.intervals import predictions_path


def confusion(sources: list[str], classes: list[str]) -> np.ndarray:
    """Counts [gold, predicted] over the predictions of ``sources`` (the seeds' evaluation JSONs), in ``classes``
    order."""
    counts = np.zeros((len(classes), len(classes)))
    index = {c: i for i, c in enumerate(classes)}
    for source in sources:
        path = predictions_path(source)
        if not path.exists():
            raise KdpipeError(f"report: {path} is missing; re-run the evaluate job of {source}")
        frame = pd.read_parquet(path, columns=["label", "pred"])
        unknown = set(frame["label"]).union(frame["pred"]) - set(index)
        if unknown:
            raise KdpipeError(f"report: {path} has class(es) {sorted(unknown)} outside {classes}")
        np.add.at(counts, (frame["label"].map(index).to_numpy(), frame["pred"].map(index).to_numpy()), 1)
    return counts


def per_class_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The classes (every class of the models, in the order of the model with the most classes: the label space)
    and, per model, its accuracy (%) on each class's rows ("—": a class the model does not predict, or without rows
    in the split)."""
    per_class = list(summary["per_class"].dropna())
    widest = max(per_class, key=len, default={})
    classes = list(dict.fromkeys([*widest, *(c for model in per_class for c in model)]))
    rows = []
    for row in summary.itertuples(index=False):
        if not row.per_class:
            continue
        cells = [f"{100 * row.per_class[c]:.1f}" if row.per_class.get(c) is not None else "—" for c in classes]
        rows.append([str(row.model), str(row.kind), *cells])
    return classes, rows


def plot_confusion(summary: pd.DataFrame, path: Path) -> None:
    """A grid of row-normalised confusion matrices, one per model (seeds pooled), the share of each gold class's
    rows written in each cell."""
    plt = pyplot()
    shown = summary[summary["per_class"].notna()]
    if shown.empty:
        placeholder(path, "No confusion matrix: the evaluations have no per-class metrics (re-run evaluate).")
        return
    ncols = min(len(shown), 4)
    nrows = -(-len(shown) // ncols)
    size = 3.0 + 0.35 * max(len(p) for p in shown["per_class"])
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows + 0.8), squeeze=False,
                             layout="constrained")  # fmt: skip
    for ax in axes.flat[len(shown) :]:
        ax.axis("off")
    for ax, row in zip(axes.flat, shown.itertuples(index=False)):
        classes = list(row.per_class)
        counts = confusion(row.sources, classes)
        with np.errstate(invalid="ignore"):
            share = counts / counts.sum(axis=1, keepdims=True)
        image = ax.imshow(share, cmap="Blues", vmin=0, vmax=1)
        for (i, j), value in np.ndenumerate(share):
            if np.isfinite(value):
                ax.text(j, i, f"{100 * value:.0f}", ha="center", va="center", fontsize=8,
                        color="white" if value > 0.6 else "0.15")  # fmt: skip
        ax.set_xticks(range(len(classes)), classes, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(classes)), classes, fontsize=8)
        ax.set_title(model_label(row), fontsize=10)
        ax.set_xlabel("predicted", fontsize=9)
        ax.set_ylabel("gold", fontsize=9)
    bar = fig.colorbar(image, ax=axes, shrink=0.6, label="% of the gold class's rows")
    bar.set_ticks(np.linspace(0, 1, 6), labels=[f"{p:.0f}" for p in np.linspace(0, 100, 6)])
    split = shown["split"].iloc[0]
    fig.suptitle(f"Confusion matrices on the {split} split (% of each gold class's rows; seeds pooled)", fontsize=12)
    save(fig, path)
    plt.close(fig)
