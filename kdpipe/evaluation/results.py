"""What an evaluation writes: ``{split}.json`` (model info, :func:`kdpipe.evaluation.metrics.classification_metrics`,
:func:`kdpipe.evaluation.metrics.uncertainty_summary` and the selective-prediction AURC of every uncertainty score,
:func:`kdpipe.evaluation.ood.selective`) and ``{split}.predictions.parquet`` (row_id, label, pred, correct,
confidence, probs, and the per-row total / aleatoric / epistemic uncertainty; with MC-dropout at evaluation also
their ``mc_`` estimates); for the OOD rows ``ood.json`` (:func:`write_ood`: each score's AUROC, AUPR and FPR at 95%
TPR against the in-distribution test rows) and ``ood.predictions.parquet``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.store import atomic_path, write_json
from kdpipe.evaluation.metrics import classification_metrics, uncertainty_split, uncertainty_summary
from kdpipe.evaluation.ood import detection, scores, selective
from kdpipe.evaluation.settings import EvalSettings, OodSpec

OOD_SPLIT = "ood"  # the OOD rows' split (kdpipe.data.dataset.OOD)
EVALUATED = ("validation", "test", OOD_SPLIT)  # every split an evaluation can write


def remove_stale(folder: Path, splits: list[str]) -> None:
    """Remove a model's evaluation files of splits this job no longer writes (``evaluate.splits`` shrunk,
    ``evaluate.ood`` dropped), so that nothing reading ``results/eval/`` finds a result of another config."""
    for split in set(EVALUATED) - set(splits):
        for name in (f"{split}.json", f"{split}.predictions.parquet"):
            (Path(folder) / name).unlink(missing_ok=True)


def sum_or_none(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def combined_label_use(records: list[dict], *, disjoint: bool = False) -> dict | None:
    """The gold labels ({split: rows}) an ensemble or the teachers' oracle read, from its members' records: counts
    add up over ``disjoint`` members, else the largest; None when a member does not say."""
    uses = [r.get("gold_labels") for r in records]
    if any(use is None for use in uses):
        return None
    combined: dict = {}
    for use in uses:
        for split, rows in use.items():
            if not isinstance(rows, int):
                combined[split] = rows  # e.g. "checkpoint": trained outside kdpipe
            else:
                combined[split] = combined.get(split, 0) + rows if disjoint else max(combined.get(split, 0), rows)
    return combined


def per_domain_accuracy(probs: np.ndarray, y: np.ndarray, domains: np.ndarray) -> dict:
    """{domain: {"n": rows, "accuracy": share predicted right}} over the domains present."""
    correct = probs.argmax(1) == y
    return {
        str(d): {"n": int((domains == d).sum()), "accuracy": float(correct[domains == d].mean())}
        for d in sorted(set(domains))
    }


def write_evaluation(
    settings: EvalSettings,
    split: str,
    member_probs: np.ndarray,
    y: np.ndarray,
    classes: list[str],
    row_ids: np.ndarray,
    extra: dict,
    out_json: Path,
    out_predictions: Path,
    domains: np.ndarray | None = None,
    mc_probs: np.ndarray | None = None,
) -> dict:
    """The JSON (metrics of the members' mean prediction, the uncertainty split, the AURC of every score, the accuracy
    per domain given ``domains``) and the predictions table of ``split``; ``mc_probs`` [T·M, N, C]: MC-dropout
    samples, whose scores are added as ``mc_*``."""
    probs = member_probs.mean(0)
    metrics = classification_metrics(probs, y, classes, ece_bins=settings.ece_bins)
    metrics["uncertainty"] = uncertainty_summary(member_probs)
    pred = probs.argmax(1)
    metrics["selective"] = selective(row_scores(member_probs, mc_probs), pred == y)
    if domains is not None:
        metrics["per_domain"] = per_domain_accuracy(probs, y, domains)
    result = settings.info(split)
    if settings.exported:  # an exported student: its precision (onnx, int8)
        result["exported"] = settings.exported
    result.update(extra, members=int(member_probs.shape[0]), classes=classes, metrics=metrics)
    if mc_probs is not None:
        result["mc_samples"] = int(settings.mc_samples)
    columns = {
        "row_id": row_ids,
        "label": y,  # (class indices: predictions_table names them)
        "pred": pred,
        "correct": pred == y,
        "confidence": probs.max(1),
        "probs": probs.astype(np.float32),
        **uncertainty_split(member_probs),
        **mc_columns(mc_probs),
    }
    if domains is not None:
        columns["domain"] = domains
    with atomic_path(out_predictions) as tmp:
        pq.write_table(predictions_table(columns, classes), tmp, compression="snappy")
    write_json(out_json, result)
    return result


def row_scores(member_probs: np.ndarray, mc_probs: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every uncertainty score of each row (:func:`kdpipe.evaluation.ood.scores`), the MC-dropout ones as ``mc_*``."""
    return scores(member_probs) | (scores(mc_probs, "mc_") if mc_probs is not None else {})


def mc_columns(mc_probs: np.ndarray | None) -> dict[str, np.ndarray]:
    """The predictions table's MC-dropout columns: the samples' mean top probability and uncertainty split."""
    if mc_probs is None:
        return {}
    split = uncertainty_split(mc_probs)
    return {"mc_confidence": mc_probs.mean(0).max(1), **{f"mc_{kind}": values for kind, values in split.items()}}


def write_ood(
    settings: EvalSettings,
    in_member_probs: np.ndarray,
    ood_member_probs: np.ndarray,
    ood_rows: pd.DataFrame,
    classes: list[str],
    extra: dict,
    out_json: Path,
    out_predictions: Path,
    in_accuracy: float | None,
    in_mc: np.ndarray | None = None,
    ood_mc: np.ndarray | None = None,
) -> dict:
    """``ood.json``: how well each uncertainty score tells the OOD rows from the in-distribution test rows
    (:func:`kdpipe.evaluation.ood.detection`), and ``ood.predictions.parquet`` (row_id, ood_label: the held-out
    class or None, pred, confidence, probs, the uncertainty split and its ``mc_*`` estimates)."""
    in_scores, out_scores = row_scores(in_member_probs, in_mc), row_scores(ood_member_probs, ood_mc)
    in_probs = in_member_probs.mean(0)
    result = settings.info(OOD_SPLIT)
    result.update(extra, members=int(ood_member_probs.shape[0]), classes=classes)
    if ood_mc is not None:
        result["mc_samples"] = int(settings.mc_samples)
    result["ood"] = {
        **ood_description(settings.ood),
        "n_in": int(in_probs.shape[0]),
        "n_ood": int(len(ood_rows)),
        "accuracy_in": in_accuracy,
        "scores": {name: detection(in_scores[name], out_scores[name]) for name in out_scores},
    }
    probs = ood_member_probs.mean(0)
    columns = {
        "row_id": ood_rows["row_id"].to_numpy(),
        "ood_label": ood_rows["label"].to_numpy() if "label" in ood_rows else np.full(len(ood_rows), None),
        "pred": np.asarray(classes)[probs.argmax(1)],
        "confidence": probs.max(1),
        "probs": list(probs.astype(np.float32)),
        **uncertainty_split(ood_member_probs),
        **mc_columns(ood_mc),
    }
    with atomic_path(out_predictions) as tmp:
        pd.DataFrame(columns).to_parquet(tmp, index=False)
    write_json(out_json, result)
    return result


def write_no_ood(settings: EvalSettings, extra: dict, out_json: Path, out_predictions: Path, reason: str) -> dict:
    """``ood.json`` of a model that has no OOD scores (``ood.scores`` null, ``ood.reason`` says why) and an empty
    predictions table."""
    result = settings.info(OOD_SPLIT)
    result.update(extra, ood={**ood_description(settings.ood), "scores": None, "reason": reason})
    empty = pd.DataFrame({"row_id": pd.Series(dtype="int64"), "ood_label": pd.Series(dtype="object")})
    with atomic_path(out_predictions) as tmp:
        empty.to_parquet(tmp, index=False)
    write_json(out_json, result)
    return result


def ood_description(ood: OodSpec | None) -> dict:
    """What the OOD rows are (the evaluation's ``ood`` setting) and the rows they are told from (the test split)."""
    ood = ood or OodSpec()
    return {
        "source": "classes" if ood.classes else "file",
        "classes": None if ood.classes is None else list(ood.classes),
        "file": ood.source,
        "in_split": "test",
    }


def _pandas_frame(columns: dict, classes: list[str], rows) -> pd.DataFrame:
    """The rows ``rows`` of the predictions as pandas held them: class names, ``probs`` one array per row."""
    frame = {key: np.asarray(value)[rows] for key, value in columns.items()}
    frame["label"], frame["pred"] = (np.asarray(classes)[frame[key]] for key in ("label", "pred"))
    frame["probs"] = list(frame["probs"])
    return pd.DataFrame(frame)


def predictions_table(columns: dict, classes: list[str]) -> pa.Table:
    """The predictions table as Arrow, the same as pandas' ``to_parquet`` of one ``probs`` array and class names per
    row makes, without those N objects (docs/design.md, "Compute"). ``columns``: values in row order, ``label`` and
    ``pred`` as class indices, ``probs`` as one [N, C] array."""
    rows = len(columns["row_id"])
    if rows == 0:  # (the empty table's column types are pandas' own guesses: made the way pandas makes them)
        return pa.Table.from_pandas(_pandas_frame(columns, classes, slice(None)), preserve_index=False)
    template = pa.Table.from_pandas(_pandas_frame(columns, classes, slice(0, 1)), preserve_index=False)
    names = pa.array(classes, type=pa.large_string())
    arrays = []
    for field in template.schema:
        values = columns[field.name]
        if field.name in ("label", "pred"):
            arrays.append(names.take(pa.array(values, type=pa.int64())).cast(field.type))
        elif field.name == "probs":
            flat = pa.array(np.ascontiguousarray(values, dtype=np.float32).ravel(), type=field.type.value_type)
            # (int32 offsets, as pandas writes them; made from int64 so that past 2^31 values Arrow refuses to wrap)
            offsets = pa.array(np.arange(0, rows * values.shape[1] + 1, values.shape[1]), type=pa.int32())
            arrays.append(pa.ListArray.from_arrays(offsets, flat, type=field.type))
        else:
            arrays.append(pa.array(np.asarray(values), type=field.type))
    return pa.Table.from_arrays(arrays, schema=template.schema)
