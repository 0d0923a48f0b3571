"""The ``finetune_teacher`` stage: fine-tune one teacher, possibly on a subset of the classes (METHODS.md §1).

A teacher with ``layers`` keeps only those transformer layers of its backbone before fine-tuning (a smaller
teacher of the same family). A teacher restricted to ``classes`` trains only on the rows of those classes, with its own local label ids
(dataset order restricted to its classes). Output: a ``save_pretrained`` directory with safetensors weights, the
tokenizer, ``labels.json`` (its local label order), ``metrics.json`` and ``manifest.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kdpipe.batching import encode_frame
from kdpipe.data import read_labels, read_split
from kdpipe.device import pick_device
from kdpipe.labelspace import resolve_classes
from kdpipe.models import keep_layers, load_classifier, load_tokenizer
from kdpipe.store import make_manifest
from kdpipe.training import TrainSettings, encoded_validator, fit, save_trained, work_paths


def rows_of_classes(frame, classes: list[str]):
    """The rows whose label is one of ``classes``, with ``local_id`` = index in ``classes``."""
    local = {c: i for i, c in enumerate(classes)}
    sub = frame[frame["label"].isin(classes)].reset_index(drop=True)
    return sub, sub["label"].map(local).to_numpy(dtype=np.int64)


def finetune_teacher(params: dict, data_dir: Path, out_dir: Path) -> dict:
    labels = read_labels(data_dir)
    classes = resolve_classes(params.get("classes"), labels, "teachers.<name>.classes")
    device = pick_device()
    tokenizer = load_tokenizer(params["backbone"])
    train, train_y = rows_of_classes(read_split(data_dir, "train"), classes)
    valid, valid_y = rows_of_classes(read_split(data_dir, "validation"), classes)
    enc_train = encode_frame(tokenizer, train, max_length=params["max_length"], label_ids=train_y)
    enc_valid = encode_frame(tokenizer, valid, max_length=params["max_length"], label_ids=valid_y)
    settings = TrainSettings.from_params(params)
    model = load_classifier(params["backbone"], classes, seed=settings.seed)
    if params.get("layers"):
        keep_layers(model, list(params["layers"]))      # a smaller teacher, e.g. Dynamic KD's (METHODS.md §2)

    def loss_fn(model, batch):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch.get("token_type_ids"), labels=batch["labels"])
        return out.loss, {}

    validate = encoded_validator(enc_valid, batch_size=params.get("eval_batch_size", 64), device=device)
    resume, log_path = work_paths(Path(out_dir))
    result = fit(model, train=enc_train, loss_fn=loss_fn, validate=validate, settings=settings, device=device,
                 log_path=log_path, resume_dir=resume, resume_key=json.dumps(params, sort_keys=True),
                 desc="teacher")
    manifest = make_manifest("teacher", config=params, labels=classes, dataset_labels=labels,
                             tokenizer=params["backbone"], rows={"train": len(train), "validation": len(valid)})
    save_trained(out_dir, model, tokenizer, classes, result, manifest)
    return manifest
