"""An external out-of-distribution set (``evaluate.ood.source``; docs/methods.md, "Judging uncertainty"): the texts of
one file, read like a transfer file (:mod:`kdpipe.data.text_readers`: only the text column), written by the ``ood`` job
as a one-split dataset artifact ``results/ood/<dataset>/`` (``ood.parquet``, ``labels.json``, ``manifest.json``)
that every evaluation job reads beside the dataset.

Dropped, and counted (:data:`_REASONS`): empty and repeated texts, texts of the dataset or the transfer rows
(compared folded, kdpipe.data.folding), and rows that hold an evaluation text (kdpipe.data.contamination;
docs/your-own-models-and-data.md, "Evaluation texts inside other texts"): such a row is not unseen.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError
from kdpipe.data.contamination import CONTAINED, SHARED, EvaluationNgrams, joined
from kdpipe.data.dataset import OOD, SPLITS, TRANSFER, read_split
from kdpipe.data.extra_split import (
    dropped_text,
    empty_texts,
    evaluation_texts,
    held_out_rows,
    next_row_id,
    write_one_split,
)
from kdpipe.data.folding import fold_columns, text_hashes
from kdpipe.data.prepare import UNLABELLED
from kdpipe.data.settings import OodSourceSettings
from kdpipe.data.text_readers import text_readers

_REASONS = {
    "empty": "empty text",
    "duplicate": "repeated OOD text",
    "dataset": "equal to a text of the dataset or the transfer rows",
    "evaluation_shared": "sharing 13 consecutive words with a validation, test or held-out class's text",
    "evaluation_contained": "containing a validation, test or held-out class's text of fewer than 13 words",
}


def build_ood(settings: OodSourceSettings, data: Path, out: Path, transfer: Path | None = None) -> dict:
    """Write the OOD artifact of ``settings`` into ``out``, beside the dataset ``data`` (and transfer rows)."""
    data_dir, out_dir, transfer_dir = Path(data), Path(out), transfer
    columns = ["text", *(["text_pair"] if settings.text_pair_column else [])]
    readers = text_readers(settings.source, "evaluate.ood.source", settings)
    frames = [batch for _, reader in readers for batch in reader()]
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=columns)
    if rows.empty:
        raise KdpipeError(f"{settings.source}: no data rows (evaluate.ood.source)")
    hashed = text_hashes(rows, columns)
    known = [text_hashes(read_split(data_dir, split), columns) for split in SPLITS]
    if (data_dir / UNLABELLED).is_file():
        known.append(text_hashes(pd.read_parquet(data_dir / UNLABELLED), columns))
    if (data_dir / f"{OOD}.parquet").is_file():  # held-out classes: their test rows, then the others
        known += [text_hashes(read_split(data_dir, OOD), columns), text_hashes(held_out_rows(data_dir), columns)]
    if transfer_dir is not None:
        known.append(text_hashes(read_split(transfer_dir, TRANSFER), columns))
    empty = empty_texts(rows, columns)
    first = ~pd.Series(hashed).duplicated().to_numpy()
    in_dataset = np.isin(hashed, np.concatenate(known))
    ngrams = EvaluationNgrams(joined(fold_columns(frame, columns)) for frame in evaluation_texts(data_dir))
    found = ngrams.find(joined(fold_columns(rows, columns)))
    open_ = ~empty & first & ~in_dataset
    dropped = {
        "empty": int(empty.sum()),
        "duplicate": int((~empty & ~first).sum()),
        "dataset": int((~empty & first & in_dataset).sum()),
        "evaluation_shared": int((open_ & (found == SHARED)).sum()),
        "evaluation_contained": int((open_ & (found == CONTAINED)).sum()),
    }
    keep, why = open_ & (found == 0), dropped_text(dropped, _REASONS)
    if not keep.any():
        raise KdpipeError(f"evaluate.ood.source: no row is left of {len(rows):,} read ({why})")
    kept = rows.loc[keep, columns].reset_index(drop=True)
    first_id = next_row_id(data_dir)
    kept.insert(0, "row_id", np.arange(first_id, first_id + len(kept), dtype=np.int64))
    manifest = write_one_split(
        out_dir,
        OOD,
        lambda path: kept.to_parquet(path, index=False),
        settings,
        data_dir,
        len(kept),
        read=len(rows),
        dropped=dropped,
        contamination=ngrams.describe(),
    )
    print(f"[kdpipe] ood: {len(kept):,} rows kept of {len(rows):,} read ({why})", file=sys.stderr)
    return manifest
