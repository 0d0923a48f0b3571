"""The ``evaluate_ensemble`` stage: an ensemble of teachers, from its members' saved predictions (no inference).

Its prediction is the mean of its members' probabilities; the outputs are those of every evaluation
(:mod:`kdpipe.evaluation.results`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError, read_json
from kdpipe.evaluation.results import sum_or_none, write_evaluation


def run(params: dict, members: list[Path], out_json: Path, out_predictions: Path) -> dict:
    """An ensemble from its members' ``{split}.predictions.parquet`` (and their JSONs beside them): the mean of
    their probabilities. Params, train and inference time are the members' sums (the cost of the ensemble)."""
    tables, records = [], []
    for path in map(Path, members):
        tables.append(pd.read_parquet(path))
        records.append(read_json(path.with_name(path.name.replace(".predictions.parquet", ".json"))))
    classes = records[0]["classes"]
    for path, table, record in zip(members, tables, records):
        if record["classes"] != classes or not np.array_equal(table["row_id"], tables[0]["row_id"]):
            raise KdpipeError(
                f"ensemble {params['model']}: member predictions {path} cover other classes or rows "
                "than the first member's; ensemble members must share one label set"
            )
    member_probs = np.stack([np.stack(t["probs"].to_numpy()) for t in tables]).astype(np.float64)
    local = {c: i for i, c in enumerate(classes)}
    y = tables[0]["label"].map(local).to_numpy(dtype=np.int64)
    extra = {key: sum_or_none(r.get(key) for r in records) for key in ("params", "train_time_s", "inference_time_s")}
    domains = tables[0]["domain"].to_numpy() if "domain" in tables[0] else None
    return write_evaluation(
        params, member_probs, y, classes, tables[0]["row_id"].to_numpy(), extra, out_json, out_predictions, domains
    )
