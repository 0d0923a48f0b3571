"""A shard's *part* of a teacher signal pass, written by every signal's module and gathered from all shards
(docs/design.md, "Signals"; the passes are :mod:`kdpipe.signals.shards`): a folder with one sub-folder per signal,
each with ``rows.npy`` (the row positions it computed, in split order), one ``.npy`` per array (values of those rows)
and ``part.json`` (what the whole artifact's manifest needs: rows, labels...)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from kdpipe.core.store import ArtifactError, KdpipeError
from kdpipe.data.batching import WHOLE
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
    """Array ``name`` of every part placed at its rows: returned, or copied in chunks into the file ``out``."""
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
    """A packed array (:mod:`kdpipe.signals.packed`) from every shard's part, each holding its rows packed in split
    order; ``offsets`` [N + 1]: where each row of the split starts. Written front to back in chunks (memory flat in
    N)."""
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
            starts = np.flatnonzero(np.diff(owner, prepend=-2))  # runs of consecutive rows from one part
            for start, stop in zip(starts, [*starts[1:], len(counts)]):
                source, begin = files[owner[start]], int(local[start])
                for at, until in source.chunks(begin, begin + int(offsets[stop] - offsets[start])):
                    full.write_at(int(offsets[start]) + at - begin, source.read(at, until))
    finally:
        for part in files:
            part.close()
