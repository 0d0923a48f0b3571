"""The ``import_teacher`` stage: a fine-tuned sequence classifier from elsewhere, used as a teacher without training.

Writes the same artifact as ``finetune_teacher`` (docs/design.md, "Artifacts"): ``labels.json`` gives the dataset
label of each of the head's outputs in the head's order (:mod:`kdpipe.models.heads`), ``metrics.json`` its validation
accuracy. The model's own ``id2label`` is rewritten to the dataset's names.
"""

from __future__ import annotations

import time
from pathlib import Path

from kdpipe.core.device import pick_device
from kdpipe.core.store import make_manifest
from kdpipe.data.batching import encode_frame
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.models.heads import head_labels, match_labels
from kdpipe.models.loading import ensure_pad_token, label_maps, load_tokenizer, load_trained
from kdpipe.stages.finetune_teacher import validation_rows
from kdpipe.training.loop import FitResult, encoded_validator, save_trained, state_on_cpu
from kdpipe.training.settings import ImportedTeacherSettings


def run(settings: ImportedTeacherSettings, data: Path, out: Path) -> dict:
    """Import the checkpoint of ``settings`` as a teacher of the dataset artifact ``data``; write it to ``out``."""
    where = f"teachers.{Path(out).name}"  # the output folder is named after the teacher
    labels = read_labels(data)
    checkpoint = settings.checkpoint
    classes = match_labels(head_labels(checkpoint, where), labels, settings.label_map, where)
    tokenizer = load_tokenizer(checkpoint)
    model = ensure_pad_token(load_trained(checkpoint), tokenizer)
    model.config.update(label_maps(classes))
    valid, valid_y = validation_rows(read_split(data, "validation"), classes, where)
    encoded = encode_frame(tokenizer, valid, max_length=settings.max_length, label_ids=valid_y)
    device = pick_device()
    started = time.perf_counter()
    metrics = encoded_validator(encoded, batch_size=settings.eval_batch_size, device=device)(model.to(device).eval())
    print(f"[kdpipe] imported {checkpoint}: validation accuracy {metrics['accuracy']:.4f} on its classes")
    result = FitResult(state_on_cpu(model), metrics, best_epoch=0, train_time_s=time.perf_counter() - started)
    manifest = make_manifest(
        "teacher",
        config=settings,
        labels=classes,
        dataset_labels=labels,
        tokenizer=checkpoint,
        rows={"train": 0, "validation": len(valid)},
        imported=True,
        gold_labels={"checkpoint": "trained outside kdpipe"},  # its validation metrics are measured, not chosen
    )
    save_trained(out, model, tokenizer, classes, result, manifest)
    return manifest
