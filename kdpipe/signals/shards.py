"""The one shard-and-gather protocol of every teacher signal pass (docs/design.md, "Signals"): a pass over one
split runs as one job that writes the artifacts (S = 1), or as S shard jobs, each on its own GPU or node, and one
gather job per signal that assembles the same artifacts as the unsharded pass.

A pass makes one or more signals (their config slices, each with its ``signal``): the teacher's shared forward pass
makes every deterministic signal the config needs of a teacher on a split (:mod:`kdpipe.signals.forward`), MC-dropout
is a pass of its own (:data:`kdpipe.signals.catalog.SIGNALS`).

A pass cuts the split into one fixed list of inference batches (rows sorted by length, ``inference_batches``);
shard k of S runs batches k, k+S, k+2S, ... of that list. Every batch is therefore the same in a sharded and an
unsharded pass (same rows, same padding, same per-batch MC-dropout seed), so the gathered artifacts are
byte-identical to the unsharded ones for a fixed seed, on the same device and thread count.

A shard writes a *part*: a folder with one sub-folder per signal, each with ``rows.npy`` (the row positions it
computed, in split order), one ``.npy`` per array (values of those rows) and ``part.json`` (what the whole
artifact's manifest needs: rows, labels...). Parts are Snakemake ``temp`` outputs, deleted once gathered; at S = 1
the pass job makes its one part in a temporary folder and writes the artifacts itself.

A signal's module (named in the catalog) has ``write(params, meta, parts, out_dir) -> manifest``, which writes the
artifact from every part, and either a ``collector`` of the shared forward's outputs (:mod:`kdpipe.signals.forward`)
or, for a pass of its own, ``compute(params, teacher_dir, data_dir, shard, part) -> (rows, meta)``, which fills the
part folder ``part`` with the shard's arrays.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import numpy as np

from kdpipe.core.store import ArtifactError, KdpipeError, atomic_path, scratch_folder
from kdpipe.data.batching import WHOLE
from kdpipe.signals import rowfile
from kdpipe.signals.catalog import signal_spec
from kdpipe.signals.rowfile import RowFile


def parse_shard(item: str | None) -> tuple[int, int]:
    """Snakemake's scatter item ``"k-of-S"`` (1-based k) -> ``(k - 1, S)``; None -> the whole split."""
    if item is None:
        return WHOLE
    match = re.fullmatch(r"(\d+)-of-(\d+)", item)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise KdpipeError(f"shard {item!r}: expected 'k-of-S' with 1 <= k <= S")
    return int(match[1]) - 1, int(match[2])


def shard_rows(batches: list[np.ndarray]) -> np.ndarray:
    """The row positions a shard's batches cover, in split order."""
    return np.sort(np.concatenate(batches)) if batches else np.zeros(0, np.int64)


def finish_part(folder: Path, rows: np.ndarray, meta: dict) -> None:
    """Add rows.npy and part.json to a part folder whose arrays are written (large ones straight into it)."""
    np.save(folder / "rows.npy", np.asarray(rows, dtype=np.int64))
    (folder / "part.json").write_text(json.dumps(meta))


def read_parts(part_dirs: list[Path]) -> tuple[dict, list[tuple[np.ndarray, Path]]]:
    """The parts' shared metadata and (rows, folder) of each; checks that they agree and cover every row once."""
    metas, parts = [], []
    for part in map(Path, part_dirs):
        metas.append(json.loads((part / "part.json").read_text()))
        parts.append((np.load(part / "rows.npy"), part))
    meta = metas[0]
    for part, other in zip(part_dirs, metas):
        if other != meta:
            raise ArtifactError(f"{part}: shard made with other settings than {part_dirs[0]}; rerun the shards")
    covered = np.zeros(meta["rows"], dtype=np.int64)
    for rows, _ in parts:
        np.add.at(covered, rows, 1)
    if not (covered == 1).all():
        raise ArtifactError(
            f"shards {[str(p) for p in part_dirs]} do not cover the {meta['rows']} rows exactly "
            "once; rerun them with one shard count"
        )
    return meta, parts


def gather_array(parts: list[tuple[np.ndarray, Path]], name: str, rows: int, out: Path | None = None):
    """Array ``name`` of every part placed at its rows: returned in memory, or copied chunk by chunk into the file
    ``out`` with plain file I/O (memory flat in N, for the large feature dumps; :mod:`kdpipe.signals.rowfile`)."""
    if out is None:
        first = np.load(parts[0][1] / f"{name}.npy", mmap_mode="r")
        full = np.zeros((rows, *first.shape[1:]), dtype=first.dtype)
        for part_rows, folder in parts:
            full[part_rows] = np.load(folder / f"{name}.npy", mmap_mode="r")
        return full
    with RowFile.open(parts[0][1] / f"{name}.npy") as first:
        shape, dtype = (rows, *first.shape[1:]), first.dtype
    with RowFile.create(out, shape, dtype) as full:
        for part_rows, folder in parts:
            with RowFile.open(folder / f"{name}.npy") as part:
                for start, stop in part.chunks():
                    full.write(part_rows[start:stop], part.read(start, stop))
    return None


def gather_packed(parts: list[tuple[np.ndarray, Path]], name: str, offsets: np.ndarray, out: Path) -> None:
    """A packed array (rows of different sizes one after the other, :mod:`kdpipe.signals.packed`) from the parts of
    every shard, each holding its own rows packed in split order: ``offsets`` [N + 1] says where each row of the
    split starts along the first axis. The output is written front to back, each run of consecutive rows from one
    part copied in chunks of at most ``CHUNK_BYTES`` (plain file I/O, memory flat in N)."""
    counts = np.diff(offsets)
    owner = np.full(len(counts), -1, dtype=np.int64)
    local = np.zeros(len(counts), dtype=np.int64)  # where each row starts in its part's file
    for p, (rows, _) in enumerate(parts):
        owner[rows] = p
        local[rows] = np.concatenate([[0], np.cumsum(counts[rows])[:-1]]) if len(rows) else local[rows]
    files = [RowFile.open(folder / f"{name}.npy") for _, folder in parts]
    try:
        first = files[0]
        for (rows, folder), part in zip(parts, files):
            if part.shape != (int(counts[rows].sum()), *first.shape[1:]) or part.dtype != first.dtype:
                raise ArtifactError(f"{folder / f'{name}.npy'}: shape {part.shape} does not fit its rows; rerun it")
        with RowFile.create(out, (int(offsets[-1]), *first.shape[1:]), first.dtype) as full:
            step = max(1, rowfile.CHUNK_BYTES // max(first.row_bytes, 1))
            starts = np.flatnonzero(np.diff(owner, prepend=-2))  # runs of consecutive rows from one part
            for start, stop in zip(starts, [*starts[1:], len(counts)]):
                source, begin, end = (
                    files[owner[start]],
                    int(local[start]),
                    int(local[start] + offsets[stop] - offsets[start]),
                )
                for at in range(begin, end, step):
                    chunk = source.read(at, min(at + step, end))
                    full.write_at(int(offsets[start]) + at - begin, chunk)
    finally:
        for part in files:
            part.close()


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
