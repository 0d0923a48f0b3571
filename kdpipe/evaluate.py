"""The ``evaluate`` stage: metrics and predictions of one trained model (teacher or student) on one split.

A subset teacher is evaluated on the rows of its own classes (its label space); every other model on all rows.
Outputs: ``{split}.json`` (model info + :func:`kdpipe.metrics.classification_metrics`) and
``{split}.predictions.parquet`` (row_id, label, pred, confidence, probs).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.batching import encode_frame
from kdpipe.data import read_split
from kdpipe.device import pick_device
from kdpipe.inference import predict_logits, softmax
from kdpipe.metrics import classification_metrics
from kdpipe.models import count_parameters, load_tokenizer, load_trained
from kdpipe.store import atomic_path, read_json, write_json


def evaluate(params: dict, model_dir: Path, data_dir: Path, out_json: Path, out_predictions: Path) -> dict:
    """``params``: model (name), base, kind, method, seed, split, batch_size, ece_bins."""
    model_dir = Path(model_dir)
    device = pick_device()
    classes = read_json(model_dir / "labels.json")
    manifest = read_json(model_dir / "manifest.json")
    model = load_trained(model_dir).to(device)
    tokenizer = load_tokenizer(str(model_dir))
    frame = read_split(data_dir, params["split"])
    frame = frame[frame["label"].isin(classes)].reset_index(drop=True)
    local = {c: i for i, c in enumerate(classes)}
    y = frame["label"].map(local).to_numpy(dtype=np.int64)
    encoded = encode_frame(tokenizer, frame, max_length=manifest["config"]["max_length"], label_ids=y)
    probs = softmax(predict_logits(model, encoded, batch_size=params["batch_size"], device=device,
                                   desc=f"evaluate {params['model']} {params['split']}"))
    metrics = classification_metrics(probs, y, classes, ece_bins=params["ece_bins"])
    trained = read_json(model_dir / "metrics.json")
    result = {key: params.get(key) for key in ("model", "base", "kind", "method", "seed", "split")}
    result.update(params=count_parameters(model), train_time_s=trained.get("train_time_s"), classes=classes,
                  metrics=metrics)
    pred = probs.argmax(1)
    table = pd.DataFrame({"row_id": frame["row_id"].to_numpy(), "label": frame["label"].to_numpy(),
                          "pred": np.asarray(classes)[pred], "correct": pred == y,
                          "confidence": probs.max(1), "probs": list(probs.astype(np.float32))})
    with atomic_path(out_predictions) as tmp:
        table.to_parquet(tmp, index=False)
    write_json(out_json, result)
    return result
