"""One extra split beside a prepared dataset, made of a user's unlabelled texts: the transfer rows or an OOD set.

What the ``transfer`` job (:mod:`kdpipe.data.transfer`) and the ``ood`` job (:mod:`kdpipe.data.ood`) share: the
evaluation texts to keep out, the count of what was dropped, the next ``row_id`` and the artifact's writer.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.checksums import verify, write_manifest
from kdpipe.core.store import ArtifactError, KdpipeError, atomic_path, make_manifest, read_manifest, write_json
from kdpipe.data.dataset import OOD, SPLITS, read_labels, read_split
from kdpipe.data.prepare import HELD_OUT, UNLABELLED
from kdpipe.data.settings import OodSourceSettings, TransferSettings


def write_one_split(
    out_dir: Path,
    split: str,
    write_rows,
    settings: TransferSettings | OodSourceSettings,
    data_dir: Path,
    rows: int,
    **fields,
) -> dict:
    """Write a one-split dataset artifact atomically (``write_rows(path)`` writes ``{split}.parquet``), with the
    dataset's labels; returns its manifest."""
    labels = read_labels(data_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        write_rows(tmp / f"{split}.parquet")
        write_json(tmp / "labels.json", labels)
        manifest = make_manifest(
            "dataset", config=settings, name=settings.name, labels=labels, rows={split: rows}, **fields
        )
        return write_manifest(tmp / "manifest.json", manifest, [f"{split}.parquet", "labels.json"])


def dropped_text(dropped: dict[str, int], reasons: dict[str, str]) -> str:
    """The rows ``dropped`` ({reason: rows}) in words (``reasons``), for the log and errors."""
    return ", ".join(f"{n:,} dropped as {reasons[k]}" for k, n in dropped.items() if n) or "none dropped"


def next_row_id(data_dir: Path) -> int:
    """One more than the largest row_id of the dataset (every split and the withheld rows)."""
    largest = -1
    for name in [*(f"{split}.parquet" for split in SPLITS), UNLABELLED]:
        path = data_dir / name
        if path.is_file():
            column = pq.read_table(path, columns=["row_id"]).column(0)
            if len(column):
                largest = max(largest, int(pa.compute.max(column).as_py()))
    if largest >= np.iinfo(np.int64).max - 10**12:
        raise KdpipeError("dataset.id_column: the ids leave no room to number the new rows after them")
    return largest + 1


def held_out_rows(data_dir: Path) -> pd.DataFrame:
    """The rows of the classes held out by ``evaluate.ood.classes`` outside the test split, checked."""
    manifest = read_manifest(data_dir / "manifest.json", kind="dataset")
    if not (data_dir / HELD_OUT).is_file():
        raise ArtifactError(f"{data_dir / HELD_OUT}: missing; the dataset holds classes out: rerun the prepare stage")
    verify(manifest, data_dir / "manifest.json", [HELD_OUT], target=data_dir)
    return pd.read_parquet(data_dir / HELD_OUT)


def evaluation_texts(data_dir: Path) -> list[pd.DataFrame]:
    """The texts no transfer or OOD row may hold: validation, test, and every row of a held-out class."""
    frames = [read_split(data_dir, split) for split in ("validation", "test")]
    if (data_dir / f"{OOD}.parquet").is_file():  # the held-out classes' rows are evaluated too: test, then the others
        frames += [read_split(data_dir, OOD), held_out_rows(data_dir)]
    return frames


def empty_texts(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """Whether each row's text (or text pair) is missing, empty or only white space."""
    empty = np.zeros(len(frame), bool)
    for column in columns:
        values = frame[column]
        empty |= values.isna().to_numpy() | (values.astype(str).str.strip() == "").to_numpy()
    return empty
