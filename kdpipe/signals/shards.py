"""The one shard-and-gather protocol of every teacher signal pass (docs/design.md, "Signals"): a pass over one
split runs as one job that writes the artifacts (S = 1), or as S shard jobs, each on its own GPU or node, and one
gather job per signal that assembles the same artifacts as the unsharded pass.

Shard k of S runs batches k, k+S, ... of the split's inference batches and writes a *part*
(:mod:`kdpipe.signals.parts`), with a ``collector`` of the shared forward or the signal module's own ``compute``;
the module's ``write`` turns the parts into the artifact (docs/adding-a-method.md).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kdpipe.core.store import atomic_path, scratch_folder
from kdpipe.signals.catalog import signal_spec
from kdpipe.signals.parts import finish_part, parse_shard, read_parts
from kdpipe.signals.settings import PassSettings, SignalSettings


def run_shard(settings: PassSettings, teacher: Path, data: Path, shard: str, out_part: Path) -> None:
    """One shard (``"k-of-S"``) of the pass of ``settings``, written atomically as a part folder."""
    signals = settings.signals
    teacher_dir, data_dir, where = Path(teacher), Path(data), parse_shard(shard)
    with atomic_path(out_part, directory=True) as tmp:
        if all(signal_spec(s.signal).forward for s in signals):
            importlib.import_module("kdpipe.signals.forward").compute(signals, teacher_dir, data_dir, where, tmp)
            return
        (signal,) = signals  # a pass of its own makes one signal
        part = Path(tmp) / signal.signal
        part.mkdir()
        module = importlib.import_module(signal_spec(signal.signal).module)
        rows, meta = module.compute(signal, teacher_dir, data_dir, where, part)
        finish_part(part, rows, meta)


def gather(settings: SignalSettings, parts: list[Path], out: Path) -> dict:
    """The artifact of the signal of ``settings`` in ``out`` from all its shards' parts; returns its manifest."""
    signal = settings.signal
    module = importlib.import_module(signal_spec(signal).module)
    meta, read = read_parts([Path(part) / signal for part in parts])
    Path(out).mkdir(parents=True, exist_ok=True)
    return module.write(settings, meta, read, Path(out))


def run_pass(settings: PassSettings, teacher: Path, data: Path, out: Path) -> dict[str, dict]:
    """The pass of ``settings`` over the whole split in one job (the same bytes as any number of shards); each
    signal's manifest."""
    Path(out).mkdir(parents=True, exist_ok=True)
    with scratch_folder(Path(out) / "pass") as tmp:  # (hidden, and removed by the next pass if killed)
        part = tmp / "part"
        run_shard(settings, teacher, data, "1-of-1", part)
        return {signal.signal: gather(signal, [part], out) for signal in settings.signals}
