"""The ``finetune_teacher`` stage: fine-tune one teacher, possibly on a subset of the classes (docs/methods.md §1).

A teacher with a ``checkpoint`` trains a fine-tuned classifier further (:mod:`kdpipe.models.heads`); one with ``layers``
keeps only those layers of its backbone; one restricted to ``classes`` or a ``domain`` trains on those rows only (local
label ids in the dataset's order). The objective is cross-entropy or one the plan names (``objective: meta``). Output:
the teacher's model folder (docs/design.md, "Artifacts").
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from kdpipe.core.device import pick_device
from kdpipe.core.memory import release_freed_memory
from kdpipe.core.store import KdpipeError, make_manifest
from kdpipe.data.batching import encode_frame, model_inputs, without_texts
from kdpipe.data.dataset import dataset_domains, read_domains, read_labels, read_split, restrict_to_domain
from kdpipe.models.heads import teacher_classes
from kdpipe.models.loading import keep_layers, load_classifier, load_tokenizer
from kdpipe.training.loop import Objective, encoded_validator, fit_job, save_trained
from kdpipe.training.settings import TeacherSettings


def rows_of_classes(frame, classes: list[str]):
    """The rows whose label is one of ``classes``, with ``local_id`` = index in ``classes``."""
    local = {c: i for i, c in enumerate(classes)}
    keep = frame["label"].isin(classes).to_numpy()
    sub = (frame if keep.all() else frame[keep]).reset_index(drop=True)  # (all kept: no copy of the texts)
    return sub, sub["label"].map(local).to_numpy(dtype=np.int64)


def validation_rows(frame, classes: list[str], where: str):
    """:func:`rows_of_classes` of the validation split, which must hold some: the best epoch is chosen on them."""
    valid, valid_y = rows_of_classes(frame, classes)
    if valid.empty:
        raise KdpipeError(
            f"{where}: the validation split has no rows of the teacher's classes {classes}, so it cannot be validated: "
            "raise dataset.split.validation, or give these classes more rows"
        )
    return valid, valid_y


def cross_entropy_loss(model, batch):
    return model(**model_inputs(batch), labels=batch["labels"]).loss, {}


def run(settings: TeacherSettings, data: Path, out: Path, prototypes: Path | None = None) -> dict:
    """Fine-tune the teacher of ``settings`` on the dataset artifact ``data``; write it to ``out``."""
    labels = read_labels(data)
    domains = dataset_domains(data)
    where = f"teachers.{Path(out).name}"  # the output folder is named after the teacher
    classes, keep_head = teacher_classes(
        settings.classes,
        labels,
        where,
        checkpoint=settings.checkpoint,
        label_map=settings.label_map,
        finetune=settings.finetune,
    )
    backbone = settings.model  # its checkpoint, trained further, or its backbone
    device = pick_device()
    tokenizer = load_tokenizer(backbone)
    frames = {
        split: restrict_to_domain(read_split(data, split), settings.domain, domains, f"{where}.domain")
        for split in ("train", "validation")
    }
    train, train_y = rows_of_classes(frames.pop("train"), classes)
    valid, valid_y = validation_rows(frames.pop("validation"), classes, where)
    enc_train = encode_frame(tokenizer, train, max_length=settings.max_length, label_ids=train_y)
    enc_valid = encode_frame(tokenizer, valid, max_length=settings.max_length, label_ids=valid_y)
    # tokenised: the texts go (a copy would otherwise stay for the whole training)
    train, rows = without_texts(train), {"train": len(train), "validation": len(valid)}
    del valid
    release_freed_memory()
    training = settings.train_settings()
    model = load_classifier(backbone, classes, seed=training.seed, keep_head=keep_head)
    if settings.layers:
        keep_layers(model, list(settings.layers))  # a smaller teacher, e.g. Dynamic KD's (docs/methods.md §2)
    objective = Objective(loss=cross_entropy_loss)
    if settings.objective != "ce":
        # imported by name: only the teachers using it carry it in their code fingerprint
        if not settings.objective_module:
            raise KdpipeError(
                f"{where}.objective: {settings.objective!r} needs its objective module in the stage's params"
            )
        read_domains(data, f"{where}.objective: {settings.objective}")
        objective = importlib.import_module(settings.objective_module).build(
            model,
            train,
            data_dir=data,
            domains=domains,
            prototypes=prototypes,
            device=device,
            args=settings.objective_args,
        )

    validate = encoded_validator(enc_valid, batch_size=settings.eval_batch_size, device=device)
    result = fit_job(model, objective, enc_train, validate, training, device, out_dir=out, job=settings, desc="teacher")
    manifest = make_manifest(
        "teacher",
        config=settings,
        labels=classes,
        dataset_labels=labels,
        tokenizer=backbone,
        rows=rows,
        domains=domains if settings.objective != "ce" else None,
        # a checkpoint trained further: what it read before is not known to kdpipe
        gold_labels={"checkpoint": "trained outside kdpipe"} if settings.checkpoint else {},
    )
    save_trained(out, model, tokenizer, classes, result, manifest, save_extra=objective.save)
    return manifest
