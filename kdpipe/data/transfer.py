"""Unlabelled transfer text (docs/your-own-models-and-data.md, "Unlabelled transfer data"): rows that teachers
label and students learn from, never evaluated, with no gold label.

Memory is flat in N (a hash and a reason per row): pass 1 (:func:`_reasons`) hashes every batch and says why each row
is dropped (:data:`_REASONS`, the first that applies), pass 2 (:func:`_write`) writes the rows kept.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.checksums import verify
from kdpipe.core.store import KdpipeError, read_manifest
from kdpipe.data.contamination import CONTAINED, SHARED, EvaluationNgrams, joined
from kdpipe.data.dataset import TRANSFER, read_split
from kdpipe.data.extra_split import dropped_text, empty_texts, evaluation_texts, next_row_id, write_one_split
from kdpipe.data.folding import copy_prefix, fold_columns, folded_hashes, text_hashes
from kdpipe.data.prepare import UNLABELLED
from kdpipe.data.settings import TransferSettings
from kdpipe.data.text_readers import BATCH_ROWS, text_readers
from kdpipe.data.transfer_sources import transfer_sources

_REASONS = {  # why a row is dropped, in words; in code order (1-based)
    "empty": "empty text",
    "duplicate": "repeated transfer text",
    "evaluation": "equal to a validation, test or held-out class's text",
    "evaluation_truncated": "the same input as a validation, test or held-out class's text once cut at max_length",
    "evaluation_shared": "sharing 13 consecutive words with a validation, test or held-out class's text",
    "evaluation_contained": "containing a validation, test or held-out class's text of fewer than 13 words",
    "labelled": "equal to a labelled training text",
    "over_max_rows": "over dataset.transfer_max_rows",
}
WITHHELD = "the withheld training rows (dataset.split.unlabelled)"


def build_transfer(settings: TransferSettings, data: Path, out: Path) -> dict:
    """Write the transfer artifact of ``settings`` into ``out``, beside the prepared dataset ``data``; its manifest."""
    data_dir, out_dir = Path(data), Path(out)
    columns = ["text", *(["text_pair"] if settings.text_pair_column else [])]
    # the withheld training rows first: they keep their row_ids, smaller than the ids given after them
    readers = []
    unlabelled = data_dir / UNLABELLED
    if unlabelled.is_file():
        manifest = read_manifest(data_dir / "manifest.json", kind="dataset")
        verify(manifest, data_dir / "manifest.json", [UNLABELLED], target=data_dir)
        readers.append((WITHHELD, lambda: _parquet_batches(unlabelled, columns)))
    readers += [
        (where, reader)
        for source in transfer_sources(settings.transfer)
        for where, reader in text_readers(source, "dataset.transfer", settings)
    ]
    if not readers:
        raise KdpipeError("dataset.transfer is not set and dataset.split.unlabelled is 0: there are no transfer rows")
    rng = np.random.default_rng([int(settings.split.seed), 7])
    prefix = copy_prefix(settings.max_length, len(columns) > 1) if settings.max_length else None
    reason, hashed, counts, rule = _reasons(readers, data_dir, columns, prefix, settings.transfer_max_rows, rng)
    dropped = {name: int((reason == code).sum()) for code, name in enumerate(_REASONS, start=1)}
    kept, why = int((reason == 0).sum()), dropped_text(dropped, _REASONS)
    if not kept:
        raise KdpipeError(f"dataset.transfer: no row is left of {len(reason):,} read ({why})")
    draw = np.empty(kept, np.int64)
    draw[rng.permutation(kept)] = np.arange(kept)
    first_id = next_row_id(data_dir)
    manifest = write_one_split(
        out_dir,
        TRANSFER,
        lambda path: _write(path, readers, reason, hashed, draw, first_id, columns),
        settings,
        data_dir,
        kept,
        read=counts["rows"],
        multiline_texts=counts["multiline_texts"],
        dropped=dropped,
        copy_prefix=prefix,
        contamination=rule,
    )
    print(f"[kdpipe] transfer: {kept:,} rows kept of {len(reason):,} read ({why})", file=sys.stderr)
    return manifest


def _reasons(
    readers, data_dir: Path, columns: list[str], prefix: int | None, cap: int | None, rng
) -> tuple[np.ndarray, np.ndarray, dict, dict]:
    """Pass 1: why each row read is dropped (a code, 1-based in ``_REASONS``; 0: kept), each row's hash, what was
    read and the contamination rule's description; ``prefix``: :func:`kdpipe.data.folding.copy_prefix` or None."""
    code = {name: i for i, name in enumerate(_REASONS, start=1)}
    evaluated = [fold_columns(frame, columns) for frame in evaluation_texts(data_dir)]
    evaluation = np.unique(np.concatenate([folded_hashes(folded) for folded in evaluated]))
    if prefix is not None:
        starts = np.unique(np.concatenate([folded_hashes(folded, prefix) for folded in evaluated]))
    ngrams = EvaluationNgrams(joined(folded) for folded in evaluated)
    del evaluated
    hashes, reasons, counts, multiline = [], [], {}, {}
    for where, reader in readers:
        read = lines = 0
        for batch in reader():
            folded = fold_columns(batch, columns)
            hashes.append(folded_hashes(folded))
            # (reasons for now, of the rows that are not also a full copy or a duplicate: decided below)
            found = ngrams.find(joined(folded))
            reason = np.zeros(len(batch), np.int8)
            reason[found == CONTAINED] = code["evaluation_contained"]
            reason[found == SHARED] = code["evaluation_shared"]
            if prefix is not None:
                reason[np.isin(folded_hashes(folded, prefix), starts)] = code["evaluation_truncated"]
            reason[empty_texts(batch, columns)] = code["empty"]
            reasons.append(reason)
            lines += int(batch["text"].str.contains("\n", regex=False).sum())
            read += len(batch)
        if not read:
            raise KdpipeError(f"{where}: no data rows (dataset.transfer)")
        key, copy = where, 1
        while key in counts:  # the same source listed twice
            copy += 1
            key = f"{where} (listed {copy} times)"
        counts[key] = read
        if lines and where != WITHHELD:  # (the dataset's own texts: their paragraphs were checked by prepare)
            # as a stray opening quote in a CSV file also makes them (kdpipe.data.files)
            multiline[key] = lines
            print(f"[kdpipe] transfer: {where}: {lines:,} of {read:,} texts span several lines", file=sys.stderr)
    counts = {"rows": counts, "multiline_texts": multiline}
    hashed, reason = np.concatenate(hashes), np.concatenate(reasons)
    first = ~pd.Series(hashed).duplicated().to_numpy()
    open_ = (reason == 0) | np.isin(
        reason, [code[name] for name in ("evaluation_truncated", "evaluation_shared", "evaluation_contained")]
    )
    reason[open_ & ~first] = code["duplicate"]
    reason[open_ & first & np.isin(hashed, evaluation)] = code["evaluation"]
    labelled = text_hashes(read_split(data_dir, "train"), columns)
    reason[(reason == 0) & np.isin(hashed, labelled)] = code["labelled"]
    kept = np.flatnonzero(reason == 0)
    if cap is not None and len(kept) > cap:
        reason[np.sort(rng.choice(kept, len(kept) - cap, replace=False))] = code["over_max_rows"]
    return reason, hashed, counts, ngrams.describe()


def _write(path: Path, readers, reason: np.ndarray, hashed: np.ndarray, draw: np.ndarray, first_id: int, columns):
    """Pass 2: the kept rows, numbered after the dataset's largest row_id; a file changed since pass 1 stops the job."""
    writer, position, written, numbered = None, 0, 0, 0
    for where, reader in readers:
        for batch in reader():
            if not np.array_equal(text_hashes(batch, columns), hashed[position : position + len(batch)]):
                raise KdpipeError(f"{where}: changed while the transfer job read it; run the job again")
            keep = reason[position : position + len(batch)] == 0
            position += len(batch)
            if not keep.any():
                continue
            rows = batch.loc[keep, columns].reset_index(drop=True)
            if "row_id" in batch:
                ids = batch.loc[keep, "row_id"].to_numpy(np.int64)
            else:
                ids = first_id + np.arange(numbered, numbered + len(rows), dtype=np.int64)
                numbered += len(rows)
            rows.insert(0, "row_id", ids)
            rows["draw"] = draw[written : written + len(rows)]
            written += len(rows)
            table = pa.Table.from_pandas(rows, preserve_index=False)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    if position != len(reason):
        raise KdpipeError(f"{where}: changed while the transfer job read it; run the job again")
    writer.close()


def transfer_rows(frame: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """The rows of a transfer split that a student reading ``fraction`` of it takes (``draw < round(f·N)``)."""
    take = int(np.floor(fraction * len(frame) + 0.5))
    return frame[frame["draw"].to_numpy() < take].reset_index(drop=True)


def _parquet_batches(path: Path, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The withheld training rows (already validated by the prepare stage), with their row_ids."""
    file = pq.ParquetFile(path, pre_buffer=False)  # (kdpipe.data.text_readers: memory flat in the row groups read)
    for batch in file.iter_batches(BATCH_ROWS, columns=["row_id", *columns]):
        yield batch.to_pandas()
