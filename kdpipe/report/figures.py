"""What every figure of the report shares: pyplot on a headless backend, saving a PNG in place atomically, a
placeholder that says why a figure is empty, and a model's two-line label. It also has :func:`text`, a table cell,
and imports nothing else of :mod:`kdpipe.report`, so every module of the report imports it without an import cycle."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kdpipe.core.store import atomic_path


def pyplot():
    """pyplot on the Agg backend: report jobs run on headless nodes, where an interactive backend would fail."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """``fig`` as a PNG at ``path``, written in place only once complete. A figure with a layout engine (constrained
    layout) already fits its contents; cropping it to them as well would lay it out twice (half a report's time)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches=None if fig.get_layout_engine() else "tight")


def placeholder(path: Path, message: str) -> None:
    """A small figure that says why a plot is empty (the workflow's report rule declares every figure)."""
    plt = pyplot()
    fig = plt.figure(figsize=(6, 1.2))
    fig.text(0.5, 0.5, message, ha="center", va="center", fontsize=11, wrap=True)
    save(fig, path)
    plt.close(fig)


def model_label(row) -> str:
    """Two-line label: the model, then what it is (teachers: how many classes they cover)."""
    if row.kind == "teacher":
        return f"{row.model}\nteacher · {row.classes} classes"
    if row.kind == "ensemble":
        return f"{row.model}\nensemble · {text(row.members)} members"
    if row.kind == "oracle":
        return f"{row.model}\nteachers routed by gold label"
    seeds = f"{row.seeds} seeds" if row.seeds > 1 else "1 seed"
    return f"{row.model}\n{text(row.method)} · {seeds}"


def text(value) -> str:
    """A table cell for a value that may be missing (a teacher's method is null)."""
    return "—" if pd.isna(value) else str(value)
