"""The ``distill`` stage: train one student from cached teacher signals only (DESIGN.md, "Data flow").

The student never sees a teacher model: it reads the signals its method declares (``kdpipe.methods.registry``)
from ``{signals_root}/{teacher}/train/``, checked against their manifests and the data split. Signals are keyed by
row_id, not by token, so the student's tokenizer may differ from the teachers' for logit-level methods. A student
restricted to a ``domain`` trains on that domain's rows and reads the same cached signals (made once for all rows),
restricted to those rows.
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
from kdpipe.data import dataset_domains, domain_ids, read_labels, read_split, restrict_to_domain
from kdpipe.device import pick_device
from kdpipe.labelspace import teacher_blocks
from kdpipe.methods.base import DistillContext
from kdpipe.methods.registry import get_method
from kdpipe.models import build_student
from kdpipe.signals import read_domain, read_features, read_logits, read_mc, read_prototype_scores
from kdpipe.store import KdpipeError, make_manifest
from kdpipe.training import TrainSettings, encoded_validator, fit, save_trained, work_paths


def load_signals(names: tuple[str, ...], signal_dir: Path, row_ids, device: torch.device,
                 attention_feature: str = "attentions") -> dict:
    """The cached signals ``names`` of one teacher on the train split, checked, as tensors on ``device`` (the large
    token-level dumps stay memory-mapped)."""
    out = {}
    if "logits" in names:
        logits, labels = read_logits(signal_dir / "logits.parquet", row_ids)
        out.update(logits=torch.tensor(logits, device=device), labels=labels)
    if "mc" in names:
        probs, scores = read_mc(signal_dir / "mc.npy", row_ids, out.get("labels"))
        out.update(mc=torch.tensor(np.asarray(probs), device=device), mc_scores=scores,
                   certainty=torch.tensor(scores["certainty"].to_numpy(), device=device))
        out.setdefault("labels", json.loads((signal_dir / "mc.json").read_text())["labels"])
    for name, file in (("hidden", "hidden"), ("attentions", attention_feature)):
        if name in names:
            array, manifest = read_features(signal_dir / f"{file}.npy", row_ids)
            out.update({name: array, f"{name}_layers": manifest["layers"], f"{name}_lengths": manifest["lengths"]})
            out.setdefault("labels", manifest["labels"])
    if "domain" in names:
        rep, expertise, manifest = read_domain(signal_dir / "domain.npy", row_ids)
        out.update(domain=rep, expertise=torch.tensor(expertise, device=device))
        out.setdefault("labels", manifest["labels"])
    return out


def subset_signals(signals: dict, positions: np.ndarray) -> dict:
    """One teacher's signals restricted to the rows ``positions`` of the split (a per-domain student): tensors and
    tables are indexed, memory-mapped dumps wrapped in a :class:`RowSubset` (nothing is copied)."""
    out = {}
    for name, value in signals.items():
        if isinstance(value, torch.Tensor):
            out[name] = value[torch.as_tensor(positions, device=value.device)]
        elif isinstance(value, pd.DataFrame):
            out[name] = value.iloc[positions].reset_index(drop=True)
        elif isinstance(value, np.ndarray) and value.ndim >= 2:
            out[name] = RowSubset(value, positions)
        elif name.endswith("_lengths"):
            out[name] = np.asarray(value)[positions].tolist()
        else:
            out[name] = value                                   # labels, layer lists
    return out


class RowSubset:
    """Rows ``positions`` of a (memory-mapped) array, indexed like the array itself: ``view[i, ...]`` reads
    ``array[positions[i], ...]``."""

    def __init__(self, array: np.ndarray, positions: np.ndarray):
        self.array, self.positions = array, np.asarray(positions)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.positions), *self.array.shape[1:])

    @property
    def ndim(self) -> int:
        return self.array.ndim

    def __getitem__(self, key):
        if isinstance(key, tuple):
            return self.array[(self.positions[key[0]], *key[1:])]
        return self.array[self.positions[key]]


@dataclass
class StudentData:
    """A student job's data and fresh model: what ``distill`` and ``cotrain`` (ProKT) both start from."""

    labels: list[str]
    train: pd.DataFrame            # the student's train rows (a domain's, for a per-domain student)
    valid: pd.DataFrame
    model: torch.nn.Module
    tokenizer: object
    enc_train: Encoded
    enc_valid: Encoded
    settings: TrainSettings
    device: torch.device
    split_row_ids: np.ndarray      # row_ids of the whole train split, the order every cached signal is in
    domains: list[str] | None      # the dataset's domains (None without a domain column)

    @property
    def train_positions(self) -> np.ndarray:
        """Position of each of the student's train rows in the whole train split."""
        return np.searchsorted(self.split_row_ids, self.train["row_id"].to_numpy())

    def validator(self, eval_batch_size: int):
        """``validate`` of the training loop for a model that predicts the dataset's labels."""
        return encoded_validator(self.enc_valid, batch_size=eval_batch_size, device=self.device)


def student_data(params: dict, data_dir: Path, attn: str | None = None) -> StudentData:
    """Read the splits (the rows of ``params["domain"]`` only, when set), build the student (``params["model"]``)
    and tokenise train and validation its way (a BiLSTM tokenises the two sides of a pair apart)."""
    labels = read_labels(data_dir)
    domains = dataset_domains(data_dir)
    full_train = read_split(data_dir, "train")
    train, valid = (restrict_to_domain(frame, params.get("domain"), domains, "students.<name>.domain")
                    for frame in (full_train, read_split(data_dir, "validation")))
    settings = TrainSettings.from_params(params)
    model, tokenizer = build_student(params["model"], labels, seed=settings.seed,
                                     pairs="text_pair" in train.columns, attn=attn)
    separate = getattr(model, "separate_pairs", False)
    encoded = [encode_frame(tokenizer, frame, max_length=params["max_length"], separate_pairs=separate,
                            label_ids=frame["label_id"].to_numpy()) for frame in (train, valid)]
    return StudentData(labels, train, valid, model, tokenizer, *encoded, settings, pick_device(),
                       full_train["row_id"].to_numpy(), domains)


def distill(params: dict, data_dir: Path, signals_root: Path, out_dir: Path, prototypes: Path | None = None) -> dict:
    method = get_method(params["method"])
    data = student_data(params, data_dir, attn="eager" if "attentions" in method.signals else None)
    device, labels = data.device, data.labels
    teachers = list(params["teachers"])
    positions = data.train_positions
    signals = {t: subset_signals(load_signals(method.signals, Path(signals_root) / t / "train", data.split_row_ids,
                                              device, params.get("attention_feature", "attentions")), positions)
               for t in teachers}
    blocks = teacher_blocks({t: signals[t]["labels"] for t in teachers}, labels, policy=method.teacher_classes,
                            where=f"student with method {method.name}")
    ctx = DistillContext(labels=labels, teachers=teachers, blocks=blocks, signals=signals, device=device,
                         student_config=data.model.config, train_lengths=data.enc_train.lengths,
                         alignment=params.get("alignment"), domains=data.domains)
    if data.domains:
        ctx.domain_ids = torch.as_tensor(domain_ids(data.train, data.domains), device=device)
    if method.prototypes:
        if prototypes is None:
            raise KdpipeError(f"method {method.name} reads the prototype scores: pass --prototypes")
        scores = read_prototype_scores(prototypes, data.split_row_ids)[positions]
        ctx.prototype_scores = torch.as_tensor(scores, device=device)
    builder = getattr(importlib.import_module(method.module), method.builder)
    objective = builder(ctx, params.get("method_args") or {})
    resume, log_path = work_paths(Path(out_dir))
    result = fit(data.model, train=data.enc_train, loss_fn=objective.loss,
                 validate=data.validator(params.get("eval_batch_size", 64)) if objective.validates else None,
                 settings=data.settings, device=device, log_path=log_path, resume_dir=resume,
                 resume_key=json.dumps(params, sort_keys=True), extra_modules=objective.extra_modules,
                 on_epoch=objective.on_epoch, extra_state=objective.extra_state,
                 desc=f"student ({method.name})")
    manifest = make_manifest("student", config=params, labels=labels, method=method.name, teachers=teachers,
                             tokenizer=params["model"], domain=params.get("domain"),
                             rows={"train": len(data.train), "validation": len(data.valid)})
    save_trained(out_dir, data.model, data.tokenizer, labels, result, manifest)
    return manifest
