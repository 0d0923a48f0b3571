"""The ``distill`` stage: train one student from cached teacher signals only (DESIGN.md, "Data flow").

The student never sees a teacher model: it reads the signals its method declares (``kdpipe.methods.registry``)
from ``{signals_root}/{teacher}/train/``, checked against their manifests and the data split. Signals are keyed by
row_id, not by token, so the student's tokenizer may differ from the teachers' for logit-level methods.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kdpipe.batching import Encoded, encode_frame
from kdpipe.data import read_labels, read_split
from kdpipe.device import pick_device
from kdpipe.labelspace import teacher_blocks
from kdpipe.methods.base import DistillContext
from kdpipe.methods.registry import get_method
from kdpipe.models import build_student
from kdpipe.signals import read_features, read_logits, read_mc
from kdpipe.store import make_manifest
from kdpipe.training import TrainSettings, encoded_validator, fit, save_trained, work_paths


def load_signals(names: tuple[str, ...], signal_dir: Path, row_ids, device: torch.device) -> dict:
    """The cached signals ``names`` of one teacher on the train split, checked, as tensors on ``device``."""
    out = {}
    if "logits" in names:
        logits, labels = read_logits(signal_dir / "logits.parquet", row_ids)
        out.update(logits=torch.tensor(logits, device=device), labels=labels)
    if "mc" in names:
        probs, scores = read_mc(signal_dir / "mc.npy", row_ids, out.get("labels"))
        out.update(mc=torch.tensor(np.asarray(probs), device=device), mc_scores=scores,
                   certainty=torch.tensor(scores["certainty"].to_numpy(), device=device))
        out.setdefault("labels", json.loads((signal_dir / "mc.json").read_text())["labels"])
    if "hidden" in names:
        hidden, manifest = read_features(signal_dir / "hidden.npy", row_ids)
        out.update(hidden=hidden, hidden_layers=manifest["layers"], hidden_lengths=manifest["lengths"])
    return out


@dataclass
class StudentData:
    """A student job's data and fresh model: what ``distill`` and ``cotrain`` (ProKT) both start from."""

    labels: list[str]
    train: pd.DataFrame
    valid: pd.DataFrame
    model: torch.nn.Module
    tokenizer: object
    enc_train: Encoded
    enc_valid: Encoded
    settings: TrainSettings
    device: torch.device

    def validator(self, eval_batch_size: int):
        """``validate`` of the training loop for a model that predicts the dataset's labels."""
        return encoded_validator(self.enc_valid, batch_size=eval_batch_size, device=self.device)


def student_data(params: dict, data_dir: Path) -> StudentData:
    """Read the splits, build the student (``params["model"]``) and tokenise train and validation its way (a
    BiLSTM tokenises the two sides of a pair apart)."""
    labels = read_labels(data_dir)
    train = read_split(data_dir, "train")
    valid = read_split(data_dir, "validation")
    settings = TrainSettings.from_params(params)
    model, tokenizer = build_student(params["model"], labels, seed=settings.seed,
                                     pairs="text_pair" in train.columns)
    separate = getattr(model, "separate_pairs", False)
    encoded = [encode_frame(tokenizer, frame, max_length=params["max_length"], separate_pairs=separate,
                            label_ids=frame["label_id"].to_numpy()) for frame in (train, valid)]
    return StudentData(labels, train, valid, model, tokenizer, *encoded, settings, pick_device())


def distill(params: dict, data_dir: Path, signals_root: Path, out_dir: Path) -> dict:
    method = get_method(params["method"])
    data = student_data(params, data_dir)
    device, labels = data.device, data.labels
    row_ids = data.train["row_id"].to_numpy()
    teachers = list(params["teachers"])
    signals = {t: load_signals(method.signals, Path(signals_root) / t / "train", row_ids, device) for t in teachers}
    blocks = teacher_blocks({t: signals[t]["labels"] for t in teachers}, labels, policy=method.teacher_classes,
                            where=f"student with method {method.name}")
    ctx = DistillContext(labels=labels, teachers=teachers, blocks=blocks, signals=signals, device=device,
                         student_config=data.model.config, train_lengths=data.enc_train.lengths,
                         alignment=params.get("alignment"))
    builder = getattr(importlib.import_module(method.module), method.builder)
    objective = builder(ctx, params.get("method_args") or {})
    resume, log_path = work_paths(Path(out_dir))
    result = fit(data.model, train=data.enc_train, loss_fn=objective.loss,
                 validate=data.validator(params.get("eval_batch_size", 64)), settings=data.settings,
                 device=device, log_path=log_path, resume_dir=resume,
                 resume_key=json.dumps(params, sort_keys=True), extra_modules=objective.extra_modules,
                 on_epoch=objective.on_epoch, extra_state=objective.extra_state,
                 desc=f"student ({method.name})")
    manifest = make_manifest("student", config=params, labels=labels, method=method.name, teachers=teachers,
                             tokenizer=params["model"],
                             rows={"train": len(data.train), "validation": len(data.valid)})
    save_trained(out_dir, data.model, data.tokenizer, labels, result, manifest)
    return manifest
