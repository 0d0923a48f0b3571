"""The one training loop shared by teacher fine-tuning and every distillation method (docs/design.md, "Style").

AdamW with linear warmup and decay, validation after each epoch keeping the best weights, a JSONL training log,
resume from checkpoints beside the job's outputs (docs/caching-and-reruns.md, "Interrupted jobs and resume"), and
data-parallel under ``torchrun``. A method differs only by its :class:`Objective`.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import torch
from torch import nn
from transformers import get_linear_schedule_with_warmup

from kdpipe.core import progress
from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast
from kdpipe.core.finished import job_identity_of_process
from kdpipe.core.store import Recorded, atomic_path, ensure_disk_space, tensor_bytes, write_json
from kdpipe.data.batching import Batches, Encoded, collate, training_batches
from kdpipe.evaluation.information import nll
from kdpipe.evaluation.results import combined_label_use
from kdpipe.models.card import model_card
from kdpipe.models.inference import probs_predictor
from kdpipe.models.loading import count_parameters, save_model
from kdpipe.training import distributed
from kdpipe.training.checkpoint import FREE_SPACE, Checkpoint, best_entry, finish, rewind_log, say, work_paths
from kdpipe.training.settings import TrainSettings as TrainSettings  # (re-exported: the loop's settings)

LossFn = Callable[[nn.Module, dict], "tuple[torch.Tensor, dict[str, float]]"]


@dataclass
class Objective:
    """What the loop optimises (a teacher's loss or a distillation method's): ``loss(model, batch) -> (loss, terms)``;
    ``extra_modules``: ``{name: (module, lr)}`` trained alongside; ``on_epoch(epoch, epochs)``: called before each
    epoch (0-based); ``extra_state``: state the loss keeps across steps (``state_dict`` / ``load_state_dict``),
    checkpointed; ``save(folder, fit_result)``: writes what else it trained into the model's folder; ``validates``:
    False to keep the last epoch instead of the best."""

    loss: LossFn
    extra_modules: dict[str, tuple[nn.Module, float]] = field(default_factory=dict)
    on_epoch: Callable[[int, int], None] | None = None
    extra_state: object | None = None
    save: Callable | None = None
    validates: bool = True


@dataclass
class FitResult:
    best_state: dict
    best_metrics: dict
    best_epoch: int
    history: list = field(default_factory=list)
    train_time_s: float = 0.0
    best_modules: dict = field(default_factory=dict)  # extra module name -> its state at the best epoch
    read_train_labels: bool = False  # the loss read the training batches' gold labels (measured: LabelWatch)
    validated: bool = False  # the kept epoch was chosen by the validation split's gold labels


class LabelWatch(dict):
    """A training batch that notes whether the loss reads its gold labels
    (docs/report.md, "Which gold labels each model read")."""

    read_labels = False

    def __getitem__(self, key):
        if key == "labels":
            self.read_labels = True
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key == "labels" and key in self:
            self.read_labels = True
        return super().get(key, default)

    def pop(self, key, *default):
        if key == "labels":
            self.read_labels = True
        return super().pop(key, *default)


def _reading_all(method):
    """``method`` of a :class:`LabelWatch` that gives every value at once (a copy, ``**batch``, iteration)."""

    def wrapped(self, *args):
        self.read_labels = self.read_labels or "labels" in self
        return method(self, *args)

    return wrapped


for _name in ("keys", "__iter__", "items", "values", "copy"):
    setattr(LabelWatch, _name, _reading_all(getattr(dict, _name)))


def state_on_cpu(module: nn.Module) -> dict:
    """A detached CPU copy of ``module``'s state dict (a best-weights snapshot)."""
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in module.state_dict().items()}


def total_steps(rows: int, settings: TrainSettings) -> int:
    """Optimiser steps of a whole training run over ``rows`` examples."""
    return math.ceil(rows / settings.batch_size) * settings.epochs


def make_optimizer(modules: dict[str, tuple[nn.Module, float]], settings: TrainSettings, steps: int):
    """AdamW over ``modules`` (``{name: (module, lr)}``), no weight decay on biases and LayerNorm weights (the usual
    BERT recipe), and its linear warmup-then-decay schedule over ``steps``."""
    groups = []
    for module, lr in modules.values():
        params = [p for p in module.parameters() if p.requires_grad]
        groups += [
            {"params": [p for p in params if p.ndim >= 2], "lr": lr, "weight_decay": settings.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "lr": lr, "weight_decay": 0.0},
        ]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], lr=settings.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings.warmup_ratio * steps), steps)
    return optimizer, scheduler


@dataclass
class _Run:
    """One call of :func:`fit`: what it trains (``modules``: ``{name: (module, lr)}``, the model first), its
    checkpointed ``state``, the ``best`` weights of every module and the open training ``log``."""

    model: nn.Module
    train: Encoded
    loss_fn: LossFn
    settings: TrainSettings
    device: torch.device
    desc: str
    modules: dict
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    ckpt: Checkpoint
    extra_state: object = None
    state: dict = field(default_factory=dict)
    best: dict = field(default_factory=dict)
    log: TextIO | None = None

    def set_training(self, training: bool) -> None:
        for module, _ in self.modules.values():
            module.train(training)

    def keep_best(self) -> None:
        self.best = {name: state_on_cpu(module) for name, (module, _) in self.modules.items()}

    def write_log(self, record: dict) -> None:
        if self.log:
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()

    def checkpoint(self) -> None:
        """Save everything a resume needs (every process takes part: the random-number states are gathered)."""
        self.state["log_bytes"] = self.log.tell() if self.log else None  # the log as of this checkpoint (rewind_log)
        tensors = {}
        if distributed.is_main():  # (the others only join in gathering the random-number states)
            tensors = {name: state_on_cpu(m) for name, (m, _) in self.modules.items()}
            tensors.update({best_entry(name): sd for name, sd in self.best.items()})
        extra = self.extra_state.state_dict() if self.extra_state is not None else None
        self.ckpt.save(self.state, tensors, self.optimizer, self.scheduler, extra)

    def result(self) -> FitResult:
        return FitResult(
            best_state=self.best["model"],
            best_metrics=self.state["best_metrics"],
            best_epoch=self.state["best_epoch"],
            history=self.state["history"],
            train_time_s=self.state["train_time_s"],
            best_modules={name: sd for name, sd in self.best.items() if name != "model"},
            read_train_labels=bool(self.state.get("read_labels")),
            validated=any(record.get("validation") for record in self.state["history"]),
        )


def fit(
    model: nn.Module,
    *,
    train: Encoded,
    loss_fn: LossFn,
    validate: Callable[[nn.Module], dict] | None,
    settings: TrainSettings,
    device: torch.device,
    log_path: Path | None = None,
    resume_dir: Path | None = None,
    resume_key: str = "",
    extra_modules: dict | None = None,
    on_epoch: Callable[[int, int], None] | None = None,
    extra_state=None,
    desc: str = "train",
) -> FitResult:
    """Train ``model`` (plus ``extra_modules``: ``{name: (module, lr)}``) and return the best validation state of
    every module. ``validate(model)`` returns a ``score`` (higher is better) and optionally an ``nll`` that breaks its
    ties; ``validate=None`` keeps the last epoch. ``on_epoch(epoch, epochs)`` (0-based) runs before each epoch."""
    # each process its own dropout masks; the first process those of a one-process run
    torch.manual_seed(settings.seed + distributed.rank())
    # an extra module's lr None: the model's own
    modules = {
        "model": (model, settings.lr),
        **{name: (m, settings.lr if lr is None else lr) for name, (m, lr) in (extra_modules or {}).items()},
    }
    for module, _ in modules.values():
        module.to(device)
    distributed.same_start([module for module, _ in modules.values()])
    optimizer, scheduler = make_optimizer(modules, settings, total_steps(len(train), settings))
    run = _Run(
        model, train, loss_fn, settings, device, desc, modules, optimizer, scheduler,
        Checkpoint(resume_dir, resume_key), extra_state,
    )  # fmt: skip
    _restore(run)
    if log_path and distributed.is_main():  # the first process's log, cut back to its length at the checkpoint
        rewind_log(Path(log_path), run.state.get("log_bytes"))
        run.log = open(log_path, "a")  # noqa: SIM115 (closed below)
    try:
        while run.state["epoch"] < settings.epochs:
            epoch = run.state["epoch"]
            batches = training_batches(train.lengths, settings.batch_size, seed=settings.seed, epoch=epoch)
            if on_epoch is not None:
                on_epoch(epoch, settings.epochs)
            _train_epoch(run, batches)
            _end_epoch(run, validate)
    finally:
        if run.log:
            run.log.close()
    return run.result()


def _restore(run: _Run) -> None:
    """Start ``run`` from its latest checkpoint, or from scratch when there is none (or none of its key)."""
    # the first process reads first: it removes a checkpoint of another configuration before the others look
    state = run.ckpt.load() if distributed.is_main() else None
    distributed.barrier()
    if not distributed.is_main():
        state = run.ckpt.load()
    if not state:
        # (log_bytes 0: a log left by an attempt killed before its first checkpoint is stale)
        run.state = dict(epoch=0, step_in_epoch=0, best_score=-math.inf, best_metrics={}, best_epoch=-1, history=[])
        run.state.update(train_time_s=0.0, log_bytes=0)
        run.keep_best()
        return
    for name, (module, _) in run.modules.items():
        module.load_state_dict(run.ckpt.tensors(name))
    optim = run.ckpt.optim()
    run.optimizer.load_state_dict(optim["optimizer"])
    run.scheduler.load_state_dict(optim["scheduler"])
    rngs = optim["torch_rngs"]
    if distributed.rank() < len(rngs):  # (a process the checkpoint did not have keeps its seed)
        torch.set_rng_state(rngs[distributed.rank()])
    if run.extra_state is not None:
        run.extra_state.load_state_dict(optim["extra"])
    run.best = {name: run.ckpt.tensors(best_entry(name)) for name in run.modules}
    run.state = state
    say(f"[kdpipe] resuming {run.desc} at epoch {state['epoch']} step {state['step_in_epoch']}")


def _train_epoch(run: _Run, batches: Batches) -> None:
    """The steps of the current epoch not done yet (``batches``: each step's rows), logged and checkpointed."""
    settings, state = run.settings, run.state
    run.set_training(True)
    params = [p for g in run.optimizer.param_groups for p in g["params"]]
    started = time.perf_counter()
    bar = progress.bar(
        int(batches.sizes.sum()),
        f"{run.desc} epoch {state['epoch'] + 1}/{settings.epochs}",
        initial=int(batches.sizes[: state["step_in_epoch"]].sum()),
        disable=not distributed.is_main(),
    )
    for step in range(state["step_in_epoch"], len(batches)):
        loss_value, terms = _step(run, batches[step], params, step)
        bar.update(len(batches[step]))
        bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
        state["step_in_epoch"] = step + 1
        if step % settings.log_every == 0:
            lr = run.scheduler.get_last_lr()[0]
            run.write_log({"epoch": state["epoch"] + 1, "step": step, "loss": loss_value, "lr": lr, **terms})
        if settings.checkpoint_every and (step + 1) % settings.checkpoint_every == 0:
            state["train_time_s"] += time.perf_counter() - started
            started = time.perf_counter()
            run.checkpoint()
    bar.close()
    state["train_time_s"] += time.perf_counter() - started


def _step(run: _Run, rows: np.ndarray, params: list, step: int) -> tuple[float, dict]:
    """One optimiser step on the global batch ``rows`` (this process's share of them): the loss and its terms."""
    rows, share = distributed.shard(rows)  # all rows with one process
    distributed.set_share(share)
    batch = LabelWatch(collate(run.train, rows, run.device))
    run.optimizer.zero_grad(set_to_none=True)  # (before the loss: ProKT's steps its own teacher inside it)
    with autocast(run.device):
        loss, terms = run.loss_fn(run.model, batch)
    if batch.read_labels:
        run.state["read_labels"] = True
    loss_value = distributed.sync_backward(loss, params)
    if not math.isfinite(loss_value):
        raise FloatingPointError(f"{run.desc}: loss is {loss_value} at epoch {run.state['epoch'] + 1} step {step}")
    torch.nn.utils.clip_grad_norm_(params, run.settings.max_grad_norm)
    run.optimizer.step()
    run.scheduler.step()
    return loss_value, terms


def _end_epoch(run: _Run, validate: Callable[[nn.Module], dict] | None) -> None:
    """Validate the epoch just trained, keep the best weights, log and checkpoint."""
    state = run.state
    epoch = state["epoch"]
    run.set_training(False)
    metrics = distributed.broadcast(validate(run.model)) if validate is not None else None
    improved = metrics is None or is_better(metrics, state["best_score"], state["best_metrics"])
    if improved:
        state.update(
            best_score=metrics["score"] if metrics else -math.inf, best_metrics=metrics or {}, best_epoch=epoch + 1
        )
        run.keep_best()
    record = {"epoch": epoch + 1, "validation": metrics, "best": improved}
    record["train_time_s"] = round(state["train_time_s"], 2)
    state["history"].append(record)
    run.write_log(record)
    say(f"[kdpipe] {run.desc} epoch {epoch + 1}: validation {metrics if metrics else 'skipped'}")
    state.update(epoch=epoch + 1, step_in_epoch=0)
    run.checkpoint()


def is_better(metrics: dict, best_score: float, best_metrics: dict) -> bool:
    """Whether an epoch's validation ``metrics`` beat the kept best: a higher ``score``, or an equal one and a lower
    ``nll`` when both have one (docs/design.md, "Style")."""
    if metrics["score"] != best_score:
        return metrics["score"] > best_score
    return "nll" in metrics and best_metrics.get("nll") is not None and metrics["nll"] < best_metrics["nll"]


def fit_job(
    model: nn.Module,
    objective: Objective,
    train: Encoded,
    validate: Callable[[nn.Module], dict] | None,
    settings: TrainSettings,
    device: torch.device,
    *,
    out_dir: Path,
    job: Recorded,
    desc: str,
) -> FitResult:
    """:func:`fit` of an :class:`Objective` for a stage job writing ``out_dir``, resumed
    only from a checkpoint of the job's identity (set by the command line), else of its settings ``job``."""
    resume, log_path = work_paths(Path(out_dir))
    return fit(
        model,
        train=train,
        loss_fn=objective.loss,
        validate=validate if objective.validates else None,
        settings=settings,
        device=device,
        log_path=log_path,
        resume_dir=resume,
        resume_key=job_identity_of_process() or json.dumps(job.to_dict(), sort_keys=True),
        extra_modules=objective.extra_modules,
        on_epoch=objective.on_epoch,
        extra_state=objective.extra_state,
        desc=desc,
    )


def encoded_validator(encoded: Encoded, *, batch_size: int, device: torch.device):
    """``validate`` for a model that predicts ``encoded``'s labels: accuracy of its eval-mode probabilities."""
    return accuracy_validator(probs_predictor(encoded, batch_size=batch_size, device=device), encoded.labels)


def accuracy_validator(predict_probs: Callable[[nn.Module], np.ndarray], labels: np.ndarray):
    """``validate`` for classification: score = accuracy of ``predict_probs(model)`` against ``labels``, and NLL."""

    def validate(model: nn.Module) -> dict:
        probs = predict_probs(model)
        acc = float((probs.argmax(1) == labels).mean()) if len(labels) else 0.0
        return {"score": acc, "accuracy": acc, "nll": nll(probs, labels) if len(labels) else 0.0}

    return validate


def label_use(manifest: dict, result: FitResult) -> dict:
    """The gold labels a trained model read to be made, as ``{split: rows}``: the training rows its loss read, the
    validation rows that chose its kept epoch, and what the manifest already names."""
    rows = manifest.get("rows") or {}
    measured = {
        split: rows[split]
        for split, read in (("train", result.read_train_labels), ("validation", result.validated))
        if read and rows.get(split)
    }
    named = manifest.get("gold_labels", {})  # None: a route or a first stage that did not record its labels
    return combined_label_use([{"gold_labels": measured}, {"gold_labels": named}])


def model_folder_bytes(model: nn.Module, tokenizer) -> int:
    """At most what a model folder takes: the weights, the tokenizer's files (under 100 bytes per vocabulary entry:
    XLM-R's 250,002 take about 22 MB) and 1 MB for the small files."""
    return tensor_bytes(model) + 100 * len(tokenizer) + (1 << 20)


# Files of a model folder its manifest does not pin: the manifest itself, and the model card, which a user may edit
UNCHECKED = ("manifest.json", "README.md")


def save_trained(
    out_dir: Path,
    model: nn.Module,
    tokenizer,
    labels: list[str],
    result: FitResult,
    manifest: dict,
    save_extra: Callable[[Path, FitResult], None] | None = None,
) -> None:
    """Write a trained model's directory atomically (the first process only): the best weights, the tokenizer
    (truncating at the training ``max_length``), ``labels.json``, ``metrics.json``, ``manifest.json``, a model card,
    ``train_log.jsonl`` and whatever ``save_extra(folder, result)`` adds; then drop the resume state."""
    if not distributed.is_main():
        return
    model.load_state_dict(result.best_state)
    max_length = (manifest.get("config") or {}).get("max_length")
    if max_length:
        tokenizer.model_max_length = int(max_length)
    manifest = {**manifest, "gold_labels": label_use(manifest, result)}
    metrics = {
        "best_epoch": result.best_epoch,
        "validation": result.best_metrics,
        "train_time_s": result.train_time_s,
        "params": count_parameters(model),
        "history": result.history,
    }
    ensure_disk_space(out_dir, model_folder_bytes(model, tokenizer), f"the model folder {out_dir}", hint=FREE_SPACE)
    with atomic_path(out_dir, directory=True) as tmp:
        save_model(model.cpu(), tokenizer, tmp)
        if save_extra is not None:
            save_extra(tmp, result)
        write_json(tmp / "labels.json", labels)
        write_json(tmp / "metrics.json", metrics)
        loader = next((name for name in ("multihead", "bilstm") if (tmp / f"{name}.json").is_file()), "transformers")
        (tmp / "README.md").write_text(model_card(manifest, metrics, params=metrics["params"], loader=loader))
        resume, log = work_paths(Path(out_dir))
        if log.exists():
            shutil.move(str(log), tmp / "train_log.jsonl")
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        write_manifest(tmp / "manifest.json", manifest, [f for f in files if f not in UNCHECKED])
        finish(tmp, Path(out_dir))
