"""The ``evaluate_ensemble`` stage: a model made from its members' saved predictions (no inference), with the outputs
of every evaluation (:mod:`kdpipe.evaluation.results`), one job per model for all its splits
(docs/caching-and-reruns.md, "Rerun rules").

An ensemble is the mean of its members' probabilities; the teachers' oracle (docs/report.md, "Baselines") takes each
row's probabilities from the teacher that owns its gold class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError, read_json
from kdpipe.data.dataset import OOD
from kdpipe.evaluation.results import (
    combined_label_use,
    remove_stale,
    sum_or_none,
    write_evaluation,
    write_no_ood,
    write_ood,
)
from kdpipe.evaluation.settings import EvalSettings


def run(settings: EvalSettings, members: list[Path], out_json: list[Path], out_predictions: list[Path]) -> list[dict]:
    """Each split of ``settings.splits`` in turn: ``members`` holds the members' predictions of the first split (in
    the order of ``settings.members``), then of the second..."""
    count, splits = len(settings.members), list(settings.splits)
    if len(members) != count * len(splits):
        raise KdpipeError(
            f"{settings.model}: {len(members)} member predictions for {count} members on {len(splits)} splits"
        )
    remove_stale(Path(out_json[0]).parent, splits)
    evaluated = zip(splits, out_json, out_predictions, strict=True)
    results = []
    for i, (split, *paths) in enumerate(evaluated):
        split_members = members[i * count : (i + 1) * count]
        if split == OOD:  # after test (the plan puts it last): test's members are the other side
            test = splits.index("test")
            results.append(evaluate_ood(settings, members[test * count : (test + 1) * count], split_members, *paths))
        else:
            results.append(evaluate_split(settings, split, split_members, *paths))
    return results


def evaluate_split(
    settings: EvalSettings, split: str, members: list[Path], out_json: Path, out_predictions: Path
) -> dict:
    """An ensemble from its members' predictions of ``split``: the mean of their probabilities."""
    tables, records = _read(members)
    extra = _extra(settings, records)
    if settings.combine == "oracle":
        return _oracle(settings, split, tables, records, extra, out_json, out_predictions)
    classes = records[0]["classes"]
    for path, table, record in zip(members, tables, records):
        if record["classes"] != classes or not np.array_equal(table["row_id"], tables[0]["row_id"]):
            raise KdpipeError(
                f"ensemble {settings.model}: member predictions {path} cover other classes or rows "
                "than the first member's; ensemble members must share one label set"
            )
    member_probs = _probs(tables)
    y = tables[0]["label"].map(_index(classes)).to_numpy(dtype=np.int64)
    domains = tables[0]["domain"].to_numpy() if "domain" in tables[0] else None
    return write_evaluation(
        settings,
        split,
        member_probs,
        y,
        classes,
        tables[0]["row_id"].to_numpy(),
        extra,
        out_json,
        out_predictions,
        domains,
    )


def evaluate_ood(
    settings: EvalSettings, test_members: list[Path], ood_members: list[Path], out_json: Path, out_predictions: Path
) -> dict:
    """The ensemble on the OOD rows against the test rows; the oracle has no OOD scores."""
    test, test_records = _read(test_members)
    ood, records = _read(ood_members)
    extra = _extra(settings, records)
    if settings.combine == "oracle":
        extra["classes"] = sorted(c for r in records for c in r["classes"])
        why = (
            "the oracle picks each row's teacher by the row's gold class, and an OOD row's class belongs to no teacher"
        )
        return write_no_ood(settings, extra, out_json, out_predictions, why)
    classes = records[0]["classes"]
    in_probs, ood_probs = _probs(test), _probs(ood)
    accuracy = float((in_probs.mean(0).argmax(1) == test[0]["label"].map(_index(classes)).to_numpy()).mean())
    rows = ood[0][["row_id", "ood_label"]].rename(columns={"ood_label": "label"})
    return write_ood(settings, in_probs, ood_probs, rows, classes, extra, out_json, out_predictions, accuracy)


def _read(paths: list[Path]) -> tuple[list[pd.DataFrame], list[dict]]:
    """Each member's predictions table and the JSON beside it."""
    tables = [pd.read_parquet(path) for path in map(Path, paths)]
    records = [read_json(Path(p).with_name(Path(p).name.replace(".predictions.parquet", ".json"))) for p in paths]
    return tables, records


def _extra(settings: EvalSettings, records: list[dict]) -> dict:
    """What the record says of the ensemble: its members' summed cost and the gold labels they read."""
    extra = {key: sum_or_none(r.get(key) for r in records) for key in ("params", "train_time_s", "inference_time_s")}
    return extra | {"gold_labels": combined_label_use(records, disjoint=settings.combine == "oracle")}


def _probs(tables: list[pd.DataFrame]) -> np.ndarray:
    """The members' probabilities [M, N, C], float64."""
    return np.stack([np.stack(t["probs"].to_numpy()) for t in tables]).astype(np.float64)


def _index(classes: list[str]) -> dict[str, int]:
    return {c: i for i, c in enumerate(classes)}


def _oracle(
    settings: EvalSettings,
    split: str,
    tables: list[pd.DataFrame],
    records: list[dict],
    extra: dict,
    out_json: Path,
    out_predictions: Path,
) -> dict:
    """Every member's rows with its probabilities placed at its classes among all the members' classes (sorted, as
    dataset labels are); a row predicted by two members means their classes overlap."""
    classes = sorted(c for r in records for c in r["classes"])
    position = {c: i for i, c in enumerate(classes)}
    row_ids = np.concatenate([t["row_id"].to_numpy() for t in tables])
    if len(set(row_ids)) != len(row_ids) or len(set(classes)) != len(classes):
        raise KdpipeError(f"oracle {settings.model}: teachers {list(settings.members)} share classes or rows")
    probs = np.zeros((len(row_ids), len(classes)))
    start = 0
    for table, record in zip(tables, records):
        block = [position[c] for c in record["classes"]]
        probs[start : start + len(table), block] = np.stack(table["probs"].to_numpy())
        start += len(table)
    labels = pd.concat([t["label"] for t in tables]).map(position).to_numpy(dtype=np.int64)
    if extra.get("gold_labels") is not None:  # it picks each row's teacher by the row's gold label
        extra["gold_labels"] = {**extra["gold_labels"], split: len(row_ids)}
    order = np.argsort(row_ids, kind="stable")
    domains = np.concatenate([t["domain"].to_numpy() for t in tables])[order] if "domain" in tables[0] else None
    return write_evaluation(
        settings,
        split,
        probs[order][None],
        labels[order],
        classes,
        row_ids[order],
        extra,
        out_json,
        out_predictions,
        domains,
    )
