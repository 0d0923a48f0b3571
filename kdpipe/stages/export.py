"""The export stages (docs/your-own-models-and-data.md, "Using the student you get"): a trained student as an ONNX
folder, that folder quantised to int8 with its accuracy check, and a model's serving profile.

Each export is checked on the validation texts of the dataset (:func:`kdpipe.models.export.export_onnx`). The int8
folder's card says what quantisation cost on the validation rows, against the fp32 graph it comes from, and whether
that passes ``export.max_accuracy_drop`` (:func:`kdpipe.evaluation.exported.accuracy_drop`); its evaluation on the
test rows, against the student, is the report's. A serving profile times requests on the test texts, in a job that
holds every core of its machine (docs/report.md, "Exported models and serving profiles").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.store import read_json
from kdpipe.data.batching import encode_frame
from kdpipe.data.dataset import read_split
from kdpipe.evaluation.exported import accuracy_drop
from kdpipe.evaluation.metrics import classification_metrics
from kdpipe.models.export import export_onnx, flag_card, quantize_int8
from kdpipe.models.inference import predict_logits, softmax
from kdpipe.models.serving import serving_profile, write_profile
from kdpipe.models.settings import ExportSettings, QuantizeSettings, ServingSettings
from kdpipe.stages.evaluate import load

CHECK_ROWS = 64  # validation texts each graph is checked on against the model it comes from


def _texts(data: Path, split: str, rows: int | None = None) -> list[str]:
    frame = read_split(data, split)
    return frame["text"].astype(str).tolist()[:rows]


def export(settings: ExportSettings, model: Path, data: Path, out: Path) -> dict:
    """The fp32 ONNX folder ``out`` of the trained student ``model``; returns its manifest."""
    texts = _texts(data, "validation", CHECK_ROWS)
    return export_onnx(model, out, name=settings.student, opset=settings.opset, check_texts=texts)


def quantize(settings: QuantizeSettings, model: Path, data: Path, out: Path) -> dict:
    """The int8 folder ``out`` of the fp32 ONNX folder ``model``, its card saying what quantisation cost on the
    validation rows; returns its manifest."""
    manifest = quantize_int8(model, out, check_texts=_texts(data, "validation", CHECK_ROWS))
    records = [_validation_record(folder, data) for folder in (Path(model), Path(out))]
    flag_card(out, accuracy_drop(*records, margin=settings.max_accuracy_drop))
    return manifest


def _validation_record(folder: Path, data: Path) -> dict:
    """A model folder's metrics on the validation rows of its classes, as an evaluation records them."""
    loaded = load(folder)
    frame = read_split(data, "validation")
    frame = frame[frame["label"].isin(loaded.classes)].reset_index(drop=True)
    y = frame["label"].map({c: i for i, c in enumerate(loaded.classes)}).to_numpy(dtype=np.int64)
    encoded = encode_frame(loaded.tokenizer, frame, max_length=loaded.max_length, label_ids=y)
    probs = softmax(predict_logits(loaded.model, encoded, batch_size=64, device=loaded.device))
    metrics = classification_metrics(probs, y, loaded.classes)
    return {"model": folder.name, "split": "validation", "metrics": metrics}


def serve(settings: ServingSettings, model: Path, data: Path, out: Path) -> dict:
    """The serving profile of the model folder ``model`` over the first ``rows`` test texts, written to ``out``."""
    texts = _texts(data, "test", settings.rows)
    warmup = min(10, len(texts) // 2)  # (a small test split keeps most of its texts for the timing)
    profile = serving_profile(
        model, texts, name=settings.model, batch_size=settings.batch_size, warmup=warmup, threads=settings.threads
    )
    profile["kind"] = settings.kind
    write_profile(profile, out)
    return read_json(out)
