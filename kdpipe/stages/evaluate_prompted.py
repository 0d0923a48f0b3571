"""The ``evaluate-prompted`` stage: a prompted LLM teacher evaluated like any model, from its passes' signals (no
inference of its own; docs/methods.md §7).

Each split's record and predictions come from the prompt ensemble's members (``prompt.npy`` of the teacher's pass on
that split): the members' mean is the teacher's prediction (its ``logits`` signal), their spread the uncertainty
split, as an ensemble's. A teacher of a class subset is evaluated on the rows of its classes. The label use is the
pass's: the few-shot examples' train rows (none for zero-shot) and what the model read before kdpipe.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import read_split
from kdpipe.evaluation.results import remove_stale, write_evaluation
from kdpipe.evaluation.settings import EvalSettings
from kdpipe.signals.prompt_members import read_members


def run(
    settings: EvalSettings, data: Path, members: list[Path], out_json: list[Path], out_predictions: list[Path]
) -> list[dict]:
    """``members``: the teacher's ``prompt.npy`` of each split of ``settings.splits``, in that order (its signal
    folder holds the ``logits.parquet`` whose row ids they follow); ``out_json`` and ``out_predictions``: one path
    per split."""
    splits = list(settings.splits)
    if len(members) != len(splits):
        raise KdpipeError(f"{settings.model}: {len(members)} prompt passes for {len(splits)} splits")
    remove_stale(Path(out_json[0]).parent, splits)
    return [
        evaluate_split(settings, split, Path(data), Path(npy), Path(json_path), Path(predictions))
        for split, npy, json_path, predictions in zip(splits, members, out_json, out_predictions, strict=True)
    ]


def evaluate_split(
    settings: EvalSettings, split: str, data: Path, npy: Path, out_json: Path, out_predictions: Path
) -> dict:
    """The metrics and predictions of ``split`` from the members' probabilities of the teacher's pass on it."""
    frame = read_split(data, split)
    row_ids = pd.read_parquet(npy.with_name("logits.parquet"), columns=["row_id"])["row_id"].to_numpy()
    if not np.array_equal(row_ids, frame["row_id"].to_numpy()):
        raise KdpipeError(f"{npy.parent}: the pass's rows are not the rows of the {split} split; rerun it")
    probs, manifest = read_members(npy, row_ids)  # [K, N, C]
    classes = list(manifest["labels"])
    keep = frame["label"].isin(classes).to_numpy()
    local = {c: i for i, c in enumerate(classes)}
    y = frame.loc[keep, "label"].map(local).to_numpy(dtype=np.int64)
    member_probs = np.asarray(probs[:, keep], dtype=np.float64)
    member_probs /= member_probs.sum(-1, keepdims=True)  # (float32 on disk: each row sums to 1 again)
    extra = {
        "params": manifest.get("parameters"),
        "train_time_s": None,
        "inference_time_s": None,
        "device": None,
        "batch_size": (manifest.get("config") or {}).get("batch_size"),
        "gold_labels": manifest.get("gold_labels"),
        "transfer_rows": 0,
        "prompt_members": list(manifest["members"]),
    }
    domains = frame.loc[keep, "domain"].to_numpy() if "domain" in frame else None
    return write_evaluation(
        settings,
        split,
        member_probs,
        y,
        classes,
        row_ids[keep],
        extra,
        out_json,
        out_predictions,
        domains,
    )
