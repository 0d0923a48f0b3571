"""The one shard-and-gather protocol of every teacher signal pass (docs/design.md, "Signals"): a pass over one
split runs as one job that writes the artifacts (S = 1), or as S shard jobs, each on its own GPU or node, and one
gather job per signal that assembles the same artifacts as the unsharded pass.

Shard k of S runs batches k, k+S, ... of the split's one list of inference batches and writes a *part*
(:mod:`kdpipe.signals.parts`); a signal module's ``write(params, meta, parts, out_dir) -> manifest`` turns the parts
into the artifact, which it computes with a ``collector`` of the shared forward (:mod:`kdpipe.signals.forward`) or
its own ``compute(params, teacher_dir, data_dir, shard, part) -> (rows, meta)``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from kdpipe.core.store import atomic_path, scratch_folder
from kdpipe.signals.catalog import signal_spec
from kdpipe.signals.parts import finish_part, parse_shard, read_parts


def run_shard(signals: list[dict], teacher_dir: Path, data_dir: Path, shard: str, out_part: Path) -> None:
    """One shard (``"k-of-S"``) of the pass that makes ``signals`` (their config slices), written atomically as a part
    folder with one sub-folder per signal."""
    teacher_dir, data_dir, where = Path(teacher_dir), Path(data_dir), parse_shard(shard)
    with atomic_path(out_part, directory=True) as tmp:
        if all(signal_spec(params["signal"]).forward for params in signals):
            importlib.import_module("kdpipe.signals.forward").compute(signals, teacher_dir, data_dir, where, tmp)
            return
        (params,) = signals  # a pass of its own makes one signal
        part = Path(tmp) / params["signal"]
        part.mkdir()
        module = importlib.import_module(signal_spec(params["signal"]).module)
        rows, meta = module.compute(params, teacher_dir, data_dir, where, part)
        finish_part(part, rows, meta)


def gather(signal: str, params: dict, part_dirs: list[Path], out_dir: Path) -> dict:
    """The artifact of ``signal`` in ``out_dir`` from the parts of all its pass's shards; returns its manifest."""
    module = importlib.import_module(signal_spec(signal).module)
    meta, parts = read_parts([Path(part) / signal for part in part_dirs])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return module.write(params, meta, parts, Path(out_dir))


def run_pass(signals: list[dict], teacher_dir: Path, data_dir: Path, out_dir: Path) -> dict[str, dict]:
    """The pass that makes ``signals`` over the whole split, in one job (one shard, gathered in the same job): the
    same bytes as any number of shards. Returns the manifest of each signal."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    with scratch_folder(Path(out_dir) / "pass") as tmp:  # (hidden, and removed by the next pass if killed)
        part = tmp / "part"
        run_shard(signals, teacher_dir, data_dir, "1-of-1", part)
        return {params["signal"]: gather(params["signal"], params, [part], out_dir) for params in signals}


def run(signal: str, params: dict, teacher_dir: Path, data_dir: Path, out_dir: Path) -> dict:
    """One signal over the whole split, in a pass of its own; returns its manifest."""
    return run_pass([{**params, "signal": signal}], teacher_dir, data_dir, out_dir)[signal]
