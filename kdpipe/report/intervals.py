"""The 95% accuracy interval of a model over its seeds and test rows, from its evaluation files
(docs/report.md, "Intervals and verdicts"; the statistics are :mod:`kdpipe.evaluation.paired`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.store import KdpipeError
from kdpipe.evaluation.paired import interval


def predictions_path(evaluation: str | Path) -> Path:
    """``{split}.predictions.parquet`` beside an evaluation's ``{split}.json``."""
    path = Path(evaluation)
    return path.with_name(path.name.removesuffix(".json") + ".predictions.parquet")


def prediction_rows(evaluation: str | Path | list[Path], columns: list[str]) -> pd.DataFrame:
    """The predictions of one evaluation, ordered by row_id: one ``{split}.json``'s table, or the tables of a list of
    evaluations on disjoint rows joined (a per-domain family: each domain's student on its own domain's rows).
    ``columns`` a table lacks (``domain`` without a domain column) are left out."""
    parts = evaluation if isinstance(evaluation, list) else [evaluation]
    tables = []
    for part in parts:
        path = predictions_path(part)
        if not path.is_file():
            raise KdpipeError(f"{path}: missing; the evaluation beside it was written without its predictions")
        try:
            present = pq.read_schema(path).names
            tables.append(pq.read_table(path, columns=[c for c in columns if c in present]).to_pandas())
        except (pa.ArrowInvalid, OSError) as err:
            raise KdpipeError(f"{path}: not a readable Parquet file ({err}); run its evaluation again") from None
    table = pd.concat(tables, ignore_index=True).sort_values("row_id", kind="stable").reset_index(drop=True)
    if table["row_id"].duplicated().any():
        if len(parts) == 1:
            raise KdpipeError(f"{predictions_path(parts[0])}: lists some rows twice; run its evaluation again")
        raise KdpipeError(f"{_name(parts)}: these evaluations share rows; a joined family's are disjoint")
    return table


def _name(evaluation: str | Path | list[Path]) -> str:
    return ", ".join(map(str, evaluation)) if isinstance(evaluation, list) else str(evaluation)


def row_matrix(evaluations: list, column: str) -> tuple[np.ndarray, np.ndarray]:
    """(row_ids [N], the predictions' ``column`` [seeds, N]: ``correct``, ``confidence``, an uncertainty score's
    column) of the evaluations of one model's seeds, rows ordered by row_id. Every evaluation (a path, or a list of
    paths on disjoint rows: :func:`prediction_rows`) must cover the same rows (the same split of the same data)."""
    row_ids, rows = None, []
    for evaluation in evaluations:
        table = prediction_rows(evaluation, ["row_id", column])
        if column not in table:
            raise KdpipeError(f"{_name(evaluation)}: its predictions have no {column!r} column")
        if table[column].isna().any():
            raise KdpipeError(f"{_name(evaluation)}: its predictions lack a {column!r} value for some rows")
        ids = table["row_id"].to_numpy()
        if row_ids is None:
            row_ids = ids
        elif not np.array_equal(ids, row_ids):
            raise KdpipeError(
                f"{_name(evaluation)}: its predictions cover other rows than {_name(evaluations[0])}'s; evaluations "
                "compared row by row must be of the same split of the same data"
            )
        rows.append(table[column].to_numpy(dtype=np.float64))
    return row_ids, np.stack(rows)


def accuracy_interval(evaluations: list[str | Path]) -> tuple[float, float]:
    """(low, high) of the 95% accuracy interval over seeds and rows; NaN when some seed's predictions are missing
    (an evaluation written without them), the seeds cover different rows, or there is one row (nothing to draw)."""
    try:
        _, correct = row_matrix(evaluations, "correct")
    except KdpipeError:
        return np.nan, np.nan
    if correct.shape[1] < 2:
        return np.nan, np.nan
    _, low, high = interval(correct)
    return low, high
