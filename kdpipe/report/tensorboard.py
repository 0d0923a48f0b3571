"""The training logs in TensorBoard's event format, for ``tensorboard --logdir results/``, written only when the
optional ``tensorboard`` package is installed (``pip install -e ".[tracking]"``; docs/report.md, "Training logs").

Each trained model becomes one run, ``<out>/<family>/<model>``, with ``train/<term>`` per logged step and
``validation/<metric>`` (plus ``validation/kept``) per epoch. Written with TensorBoard's own event-file writer: torch's
``SummaryWriter`` would import torch into a stage that runs no model.
"""

from __future__ import annotations

import shutil
import time
from numbers import Real
from pathlib import Path

from kdpipe.report.curves import read_log

NOT_SCALARS = ("epoch", "step")


def write_tensorboard(train_logs: list[str | Path], out: Path) -> bool:
    """Write every log's scalars under ``out`` (replaced whole); False, writing nothing, without tensorboard."""
    if not train_logs:
        return False
    try:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
    except ImportError:  # the optional ``tracking`` extra is not installed
        return False

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for log in map(Path, train_logs):
        steps, epochs = read_log(log)
        per_epoch = max((step for _, step in steps), default=0) + 1  # an epoch's steps, as far as the log shows
        kept = [epoch for epoch, entry in epochs.items() if entry.get("best")]
        writer = EventFileWriter(str(tmp / log.parent.parent.name / log.parent.name))
        for (epoch, step), entry in steps.items():
            for key, value in entry.items():
                if key not in NOT_SCALARS and isinstance(value, Real):
                    _add_scalar(writer, f"train/{key}", value, (epoch - 1) * per_epoch + step)
        for epoch, entry in epochs.items():
            for key, value in entry["validation"].items():
                if isinstance(value, Real):
                    _add_scalar(writer, f"validation/{key}", value, epoch)
            _add_scalar(writer, "validation/kept", float(bool(kept) and epoch == kept[-1]), epoch)
        writer.close()
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return True


def _add_scalar(writer, tag: str, value: float, step: int) -> None:
    """One scalar event, as TensorBoard's own summaries write it (``simple_value``)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary

    summary = Summary(value=[Summary.Value(tag=tag, simple_value=float(value))])
    writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))
