"""Training curves from the ``train_log.jsonl`` every training job writes (kdpipe.training.loop): the training loss
per logged step and the validation accuracy after each epoch, with the epoch whose weights were kept marked.

The kept epoch is the last whose validation line has ``best`` true; of lines a resumed job wrote again the last wins.
The loss is drawn against the fractional epoch ``epoch − 1 + step / S`` (``step`` from 0 in each epoch; S: one more
than the largest step logged), so that it shares its axis with the validation metrics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kdpipe.core.store import KdpipeError
from kdpipe.report.figures import placeholder, pyplot, save

FAMILIES = {"teachers": "teachers", "students": "students", "cotrained": "co-trained teachers"}


@dataclass
class Curve:
    model: str
    family: str  # "teachers", "students" or "cotrained": the folder the model lives in
    steps: np.ndarray  # fractional epoch of each logged loss
    loss: np.ndarray
    epochs: np.ndarray  # 1, 2, ...
    accuracy: np.ndarray  # validation accuracy after each epoch
    kept: int | None  # the epoch whose weights were kept (None: no validation, the last)


def read_log(path: str | Path) -> tuple[dict[tuple[int, int], dict], dict[int, dict]]:
    """A training log as ((epoch, step) -> its line, epoch -> its validation line), in training order, the last
    line of a step or an epoch winning (a resumed job appends to its log)."""
    path = Path(path)
    steps, epochs = {}, {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as error:
            raise KdpipeError(f"{path}:{number}: not a JSON line ({error.msg})") from None
        if "step" in entry and "loss" in entry:
            steps[entry.get("epoch", 1), entry["step"]] = entry
        elif isinstance(entry.get("validation"), dict):
            epochs[entry["epoch"]] = entry
    return dict(sorted(steps.items())), dict(sorted(epochs.items()))


def read_curve(path: str | Path) -> Curve:
    """The curve of ``results/<family>/<model>/train_log.jsonl``."""
    path = Path(path)
    steps, epochs = read_log(path)
    kept = [epoch for epoch, entry in epochs.items() if entry.get("best")]
    per_epoch = max((step for _, step in steps), default=0) + 1  # S (the module's docstring)
    return Curve(
        model=path.parent.name,
        family=path.parent.parent.name,
        steps=np.array([epoch - 1 + step / per_epoch for epoch, step in steps], dtype=float),
        loss=np.array([e["loss"] for e in steps.values()], dtype=float),
        epochs=np.array(list(epochs), dtype=float),
        accuracy=np.array([e["validation"].get("accuracy", np.nan) for e in epochs.values()], dtype=float),
        kept=kept[-1] if kept else None,
    )


def plot_curves(curves: list[Curve], path: Path) -> None:
    """One row per family of models: the training loss per logged step, raw and smoothed (left), and the validation
    accuracy after each epoch, the kept epoch circled (right); seeds of one model share its colour."""
    if not curves:
        placeholder(path, "No training curves: no model of this report was trained by the workflow.")
        return
    plt = pyplot()
    families = [f for f in FAMILIES if any(c.family == f for c in curves)]
    families += sorted({c.family for c in curves} - set(families))
    fig, axes = plt.subplots(len(families), 2, figsize=(14, 4.2 * len(families)), squeeze=False, layout="constrained")
    for (ax_loss, ax_acc), family in zip(axes, families):
        members = [c for c in curves if c.family == family]
        colours = {}
        for curve in members:
            base = curve.model.split(".seed")[0]
            label = None if base in colours else base  # one legend entry per model, not per seed
            colour = colours.setdefault(base, f"C{len(colours) % 10}")
            if len(curve.loss):
                ax_loss.plot(curve.steps, curve.loss, color=colour, alpha=0.25, linewidth=0.8)
                ax_loss.plot(curve.steps, _smooth(curve.loss), color=colour, linewidth=1.6)
            if len(curve.epochs):
                ax_acc.plot(curve.epochs, 100 * curve.accuracy, marker=".", color=colour, linewidth=1.4, label=label)
            if curve.kept is not None:
                at = curve.epochs == curve.kept
                ax_acc.scatter(curve.epochs[at], 100 * curve.accuracy[at], s=110, facecolors="none",
                               edgecolors=colour, linewidths=1.8, zorder=3)  # fmt: skip
        name = FAMILIES.get(family, family)
        ax_loss.set_title(f"{name}: training loss", fontsize=11)
        ax_loss.set_xlabel("epoch (logged steps)", fontsize=9)
        if any(len(c.loss) and np.all(c.loss > 0) for c in members):
            ax_loss.set_yscale("log")
        ax_acc.set_title(f"{name}: validation accuracy (○ the epoch whose weights were kept)", fontsize=11)
        ax_acc.set_xlabel("epoch", fontsize=9)
        ax_acc.set_ylabel("%", fontsize=9)
        epochs = max((len(c.epochs) for c in members), default=1)
        ax_acc.set_xticks(range(1, epochs + 1))
        for ax in (ax_loss, ax_acc):
            ax.grid(alpha=0.3, linewidth=0.5)
            ax.tick_params(labelsize=8)
        ax_acc.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False, fontsize=9)
    fig.suptitle("Training curves", fontsize=13)
    save(fig, path)
    plt.close(fig)


def _smooth(values: np.ndarray, window: int = 5) -> np.ndarray:
    """A trailing moving average (the first points average what there is): the logged loss of one batch is noisy."""
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts
