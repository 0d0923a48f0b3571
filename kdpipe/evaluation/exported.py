"""An exported or quantised model against the model it was made from, on the same rows
(docs/report.md, "Exported models and serving profiles"): how often the two predict the same class, and the
accuracy and calibration the export cost, each difference with a paired 95% interval
(:mod:`kdpipe.evaluation.paired`: one bootstrap draw of the rows shared by both models); and the flag of a
quantised model whose accuracy falls by more than a margin.

Both read what an evaluation writes (:mod:`kdpipe.evaluation.results`): ``{split}.predictions.parquet`` for the
rows, ``{split}.json`` for the flag.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError, read_json, write_json
from kdpipe.evaluation.paired import CalibrationError, compare

MARGIN = 0.01  # the accuracy a quantised model may lose before it is flagged: one point


def _rows(path: str | Path) -> pd.DataFrame:
    frame = pd.read_parquet(path, columns=["row_id", "pred", "correct", "confidence", "probs"])
    if frame["row_id"].duplicated().any():
        raise KdpipeError(f"{path}: a row_id appears twice; re-run its evaluation")
    return frame.set_index("row_id")


def against_reference(predictions: str | Path, reference: str | Path, *, ece_bins: int = 15, seed: int = 0) -> dict:
    """A model's predictions (``{split}.predictions.parquet``) against those of the model it was exported from,
    row by row on the rows both evaluated (they must be the same rows): ``agreement`` (the share predicted alike),
    ``max_abs_prob_diff``, and A − B of the accuracy and of the ECE (``ece_bins`` equal-width bins, as the
    evaluation's) with their paired 95% bootstrap intervals, p-values and smallest detectable differences."""
    mine, theirs = _rows(predictions), _rows(reference)
    if set(mine.index) != set(theirs.index):
        raise KdpipeError(
            f"{predictions}: its rows are not those of {reference} ({len(mine)} and {len(theirs)} rows, "
            f"{len(set(mine.index) ^ set(theirs.index))} in one only); evaluate both on the same split"
        )
    if len(mine) < 2:
        raise KdpipeError(f"{predictions}: {len(mine)} row(s); a paired comparison with {reference} needs two or more")
    theirs = theirs.loc[mine.index]
    correct = mine["correct"].to_numpy(dtype=float)[None]
    reference_correct = theirs["correct"].to_numpy(dtype=float)[None]
    accuracy = compare(correct, reference_correct, seed=seed)
    ece = compare(
        CalibrationError(mine["confidence"].to_numpy()[None], correct, bins=ece_bins),
        CalibrationError(theirs["confidence"].to_numpy()[None], reference_correct, bins=ece_bins),
        seed=seed,
    )
    probs, reference_probs = np.stack(mine["probs"].to_numpy()), np.stack(theirs["probs"].to_numpy())
    return {
        "n": int(len(mine)),
        "agreement": float((mine["pred"].to_numpy() == theirs["pred"].to_numpy()).mean()) if len(mine) else None,
        "max_abs_prob_diff": float(np.abs(probs - reference_probs).max()) if len(mine) else None,
        "accuracy": float(correct.mean()),
        "reference_accuracy": float(reference_correct.mean()),
        "accuracy_difference": _difference(accuracy),
        "ece_difference": _difference(ece),
    }


def _difference(comparison) -> dict:
    return {
        "difference": comparison.difference,
        "low": comparison.low,
        "high": comparison.high,
        "p_value": comparison.p_value,
        "detectable": comparison.detectable,
    }


def with_reference(out_json: str | Path, predictions: str | Path, reference: str | Path, name: str, **options) -> dict:
    """The evaluation ``out_json`` with a ``reference`` block: :func:`against_reference` of its ``predictions``
    against the ``reference`` predictions of the model ``name``, written back in place (atomically)."""
    record = read_json(out_json)
    ece_bins = len(record["metrics"]["reliability"]["bin_edges"]) - 1 if "metrics" in record else 15
    record["compared_with"] = {"model": name, **against_reference(predictions, reference, ece_bins=ece_bins, **options)}
    write_json(out_json, record)
    return record


def accuracy_drop(reference: dict | str | Path, quantised: dict | str | Path, *, margin: float = MARGIN) -> dict:
    """Whether a quantised model's accuracy falls by more than ``margin`` (a fraction: 0.01 is one point) below its
    fp32 model's on the same split: from the two evaluations (``{split}.json`` records or their paths). The paired
    interval of the difference comes from the quantised evaluation's ``compared_with`` block when that compares it with
    the same model (:func:`with_reference`)."""
    fp32 = reference if isinstance(reference, dict) else read_json(reference)
    int8 = quantised if isinstance(quantised, dict) else read_json(quantised)
    if fp32.get("split") != int8.get("split") or fp32["metrics"]["n"] != int8["metrics"]["n"]:
        raise KdpipeError(
            f"accuracy check of {int8.get('model')}: evaluated on {int8.get('split')} ({int8['metrics']['n']} rows), "
            f"its fp32 model {fp32.get('model')} on {fp32.get('split')} ({fp32['metrics']['n']} rows); compare "
            "evaluations of the same split"
        )
    difference = int8["metrics"]["accuracy"] - fp32["metrics"]["accuracy"]
    paired = int8.get("compared_with") or {}
    interval = None
    if paired.get("model") == fp32.get("model"):
        interval = [paired["accuracy_difference"]["low"], paired["accuracy_difference"]["high"]]
    return {
        "model": int8.get("model"),
        "reference": fp32.get("model"),
        "split": int8.get("split"),
        "n": int(int8["metrics"]["n"]),
        "accuracy": int8["metrics"]["accuracy"],
        "reference_accuracy": fp32["metrics"]["accuracy"],
        "difference": difference,
        "interval": interval,
        "agreement": paired.get("agreement") if interval else None,
        "ece": int8["metrics"]["ece"],
        "reference_ece": fp32["metrics"]["ece"],
        "nll": int8["metrics"]["nll"],
        "reference_nll": fp32["metrics"]["nll"],
        "margin": margin,
        "flagged": bool(round(-difference, 12) > margin),  # (k/n differences: no float dust)
    }


def write_accuracy_drop(flag: dict, out_json: str | Path) -> None:
    """The flag as JSON (``results/eval/<model>/quantisation.json`` say; the report reads it)."""
    write_json(out_json, flag)
