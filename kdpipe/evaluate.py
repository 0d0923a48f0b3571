"""The ``evaluate`` stages: metrics and predictions of one model on one split.

``evaluate``: a trained model (teacher or student). A subset teacher is evaluated on the rows of its own classes
(its label space), a model trained for one ``domain`` on that domain's rows; every other model on all rows. When
the data has domains, the JSON also gives each domain's accuracy (``metrics.per_domain``), so a model of all
domains can be compared with per-domain students on each domain's rows.

``evaluate_ensemble``: an ensemble of teachers, from its members' saved predictions (no inference): the mean of
their probabilities.

Every model gets the uncertainty split of METHODS.md §3 (total = entropy of the mean prediction, aleatoric = mean
member entropy, epistemic = their difference, the mutual information) over its members: the heads of a multi-head
student, the members of an ensemble, or the model itself (M = 1, epistemic 0).

Outputs: ``{split}.json`` (model info, :func:`kdpipe.metrics.classification_metrics` and
:func:`kdpipe.metrics.uncertainty_summary`) and ``{split}.predictions.parquet`` (row_id, label, pred, correct,
confidence, probs, and the per-row total / aleatoric / epistemic uncertainty).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.batching import encode_frame
from kdpipe.data import dataset_domains, read_split, restrict_to_domain
from kdpipe.device import pick_device
from kdpipe.inference import predict_member_logits, softmax
from kdpipe.metrics import classification_metrics, uncertainty_split, uncertainty_summary
from kdpipe.models import count_parameters, load_tokenizer, load_trained
from kdpipe.store import KdpipeError, atomic_path, read_json, write_json

INFO = ("model", "base", "group", "kind", "method", "seed", "split", "domain")


def evaluate(params: dict, model_dir: Path, data_dir: Path, out_json: Path, out_predictions: Path) -> dict:
    """``params``: model (name), base, kind, method, seed, split, batch_size, ece_bins."""
    model_dir = Path(model_dir)
    device = pick_device()
    classes = read_json(model_dir / "labels.json")
    manifest = read_json(model_dir / "manifest.json")
    model = load_trained(model_dir).to(device)
    tokenizer = load_tokenizer(str(model_dir))
    frame = restrict_to_domain(read_split(data_dir, params["split"]), params.get("domain"),
                               dataset_domains(data_dir), f"evaluate {params['model']}")
    frame = frame[frame["label"].isin(classes)].reset_index(drop=True)
    local = {c: i for i, c in enumerate(classes)}
    y = frame["label"].map(local).to_numpy(dtype=np.int64)
    encoded = encode_frame(tokenizer, frame, max_length=manifest["config"]["max_length"], label_ids=y,
                           separate_pairs=getattr(model, "separate_pairs", False))
    started = time.perf_counter()
    member_probs = softmax(predict_member_logits(model, encoded, batch_size=params["batch_size"], device=device,
                                                 desc=f"evaluate {params['model']} {params['split']}"))
    inference_time = time.perf_counter() - started
    trained = read_json(model_dir / "metrics.json")
    extra = {"params": count_parameters(model), "train_time_s": trained.get("train_time_s"),
             "inference_time_s": inference_time}
    return _write(params, member_probs, y, classes, frame["row_id"].to_numpy(), extra, out_json, out_predictions,
                  frame["domain"].to_numpy() if "domain" in frame else None)


def evaluate_ensemble(params: dict, member_predictions: list[Path], out_json: Path, out_predictions: Path) -> dict:
    """An ensemble from its members' ``{split}.predictions.parquet`` (and their JSONs beside them): the mean of
    their probabilities. Params, train and inference time are the members' sums (the cost of the ensemble)."""
    tables, records = [], []
    for path in map(Path, member_predictions):
        tables.append(pd.read_parquet(path))
        records.append(read_json(path.with_name(path.name.replace(".predictions.parquet", ".json"))))
    classes = records[0]["classes"]
    for path, table, record in zip(member_predictions, tables, records):
        if record["classes"] != classes or not np.array_equal(table["row_id"], tables[0]["row_id"]):
            raise KdpipeError(f"ensemble {params['model']}: member predictions {path} cover other classes or rows "
                              "than the first member's; ensemble members must share one label set")
    member_probs = np.stack([np.stack(t["probs"].to_numpy()) for t in tables]).astype(np.float64)
    local = {c: i for i, c in enumerate(classes)}
    y = tables[0]["label"].map(local).to_numpy(dtype=np.int64)
    extra = {key: _sum(r.get(key) for r in records) for key in ("params", "train_time_s", "inference_time_s")}
    domains = tables[0]["domain"].to_numpy() if "domain" in tables[0] else None
    return _write(params, member_probs, y, classes, tables[0]["row_id"].to_numpy(), extra, out_json,
                  out_predictions, domains)


def _sum(values) -> float | None:
    values = list(values)
    return None if any(v is None for v in values) else sum(values)


def per_domain_accuracy(probs: np.ndarray, y: np.ndarray, domains: np.ndarray) -> dict:
    """{domain: {"n": rows, "accuracy": share predicted right}} over the domains present."""
    correct = probs.argmax(1) == y
    return {str(d): {"n": int((domains == d).sum()), "accuracy": float(correct[domains == d].mean())}
            for d in sorted(set(domains))}


def _write(params: dict, member_probs: np.ndarray, y: np.ndarray, classes: list[str], row_ids: np.ndarray,
           extra: dict, out_json: Path, out_predictions: Path, domains: np.ndarray | None = None) -> dict:
    """Metrics of the members' mean prediction plus the uncertainty split (and the accuracy per domain, given each
    row's domain); the JSON and the predictions table."""
    probs = member_probs.mean(0)
    metrics = classification_metrics(probs, y, classes, ece_bins=params["ece_bins"])
    metrics["uncertainty"] = uncertainty_summary(member_probs)
    if domains is not None:
        metrics["per_domain"] = per_domain_accuracy(probs, y, domains)
    result = {key: params.get(key) for key in INFO}
    result.update(extra, members=int(member_probs.shape[0]), classes=classes, metrics=metrics)
    pred = probs.argmax(1)
    table = pd.DataFrame({"row_id": row_ids, "label": np.asarray(classes)[y], "pred": np.asarray(classes)[pred],
                          "correct": pred == y, "confidence": probs.max(1), "probs": list(probs.astype(np.float32)),
                          **uncertainty_split(member_probs)})
    if domains is not None:
        table["domain"] = domains
    with atomic_path(out_predictions) as tmp:
        table.to_parquet(tmp, index=False)
    write_json(out_json, result)
    return result
