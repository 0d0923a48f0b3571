"""The one training loop shared by teacher fine-tuning and every distillation method (docs/design.md, "Style").

AdamW with linear warmup and decay, gradient clipping, length-bucketed batches, bf16 autocast on CUDA,
evaluation on validation after each epoch keeping the best weights, a tqdm progress bar, a JSONL training log,
and resume: the full state (model and extra modules, optimiser, scheduler, best weights, history, position in the
epoch) is checkpointed atomically to a resume directory outside the job's declared outputs (Snakemake deletes
those before a rerun), after every epoch and every ``checkpoint_every`` steps. A resume directory made by another
configuration (different ``resume_key``) is discarded, never reused. Under ``torchrun`` the same loop trains
data-parallel over several processes (:mod:`kdpipe.training.distributed`): same global batch, schedule, checkpoints
and outputs as one process.

A method differs only by its ``loss_fn(model, batch) -> (loss, {name: float})`` and, when it trains modules of its
own (e.g. DFA adapters), by ``extra_modules`` with their own learning rates (None: the model's). A loss that
carries training state of
its own across steps (ProKT's co-trained teacher with its optimiser) passes it as ``extra_state``, an object with
``state_dict()`` / ``load_state_dict()``, so that it is checkpointed and resumed with everything else.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup

from kdpipe.core.checksums import checksum, write_manifest
from kdpipe.core.device import autocast
from kdpipe.core.finished import job_identity_of_process, keep_finished, work_dir
from kdpipe.core.store import ArtifactError, atomic_path, ensure_disk_space, read_json, tensor_bytes, write_json
from kdpipe.data.batching import Encoded, collate, training_batches
from kdpipe.models.card import model_card
from kdpipe.models.inference import probs_predictor
from kdpipe.models.loading import count_parameters, save_model
from kdpipe.training import distributed

FREE_SPACE = "free space on that disk (or set checkpoint_every: 0 to checkpoint only at epoch ends)"
LossFn = Callable[[nn.Module, dict], "tuple[torch.Tensor, dict[str, float]]"]


@dataclass
class TrainSettings:
    epochs: int
    lr: float
    batch_size: int = 16
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    checkpoint_every: int = 200
    log_every: int = 10

    @classmethod
    def from_params(cls, params: dict) -> TrainSettings:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in params.items() if k in names})


@dataclass
class FitResult:
    best_state: dict
    best_metrics: dict
    best_epoch: int
    history: list = field(default_factory=list)
    train_time_s: float = 0.0
    best_modules: dict = field(default_factory=dict)  # extra module name -> its state at the best epoch


def state_on_cpu(module: nn.Module) -> dict:
    """A detached CPU copy of ``module``'s state dict (a best-weights snapshot)."""
    return {k: v.detach().to("cpu").clone().contiguous() for k, v in module.state_dict().items()}


def _save_state(state: dict, path: Path) -> None:
    # Tied weights share storage; safetensors refuses shared tensors, so store independent copies.
    save_file({k: v.clone().contiguous() for k, v in state.items()}, str(path))


def param_groups(modules: dict[str, tuple[nn.Module, float]], weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases and LayerNorm weights (the usual BERT recipe)."""
    groups = []
    for module, lr in modules.values():
        decay, no_decay = [], []
        for _name, p in module.named_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 else decay).append(p)
        groups += [
            {"params": decay, "lr": lr, "weight_decay": weight_decay},
            {"params": no_decay, "lr": lr, "weight_decay": 0.0},
        ]
    return [g for g in groups if g["params"]]


def total_steps(rows: int, settings: TrainSettings) -> int:
    """Optimiser steps of a whole training run over ``rows`` examples."""
    return math.ceil(rows / settings.batch_size) * settings.epochs


def make_optimizer(modules: dict[str, tuple[nn.Module, float]], settings: TrainSettings, steps: int):
    """AdamW over ``modules`` (``{name: (module, lr)}``) and its linear warmup-then-decay schedule over ``steps``."""
    optimizer = torch.optim.AdamW(param_groups(modules, settings.weight_decay), lr=settings.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, int(settings.warmup_ratio * steps), steps)
    return optimizer, scheduler


class _Checkpoint:
    """The resume directory: numbered checkpoint folders and a ``LATEST`` pointer.

    A new checkpoint is written to a fresh folder, then ``LATEST`` is atomically switched to it, then older
    folders are removed; a kill at any moment leaves ``LATEST`` naming a complete checkpoint.
    """

    def __init__(self, root: Path | None, key: str):
        self.root, self.key = (Path(root) if root else None), key
        self.count = 0

    def current(self) -> Path | None:
        pointer = self.root / "LATEST" if self.root else None
        if pointer is None or not pointer.exists():
            return None
        return self.root / pointer.read_text().strip()

    def load(self) -> dict | None:
        """The state of the latest checkpoint, or None (and the resume folder cleared, with a log line) when there
        is none, it was made by a job of another identity, or a file of it is damaged (its checksum differs from
        the one recorded when it was written): training then starts from scratch."""
        try:
            current = self.current()
            if current is None:
                return None
            state = read_json(current / "state.json")
            if state.get("resume_key") != self.key:
                _say(f"[kdpipe] {self.root}: a checkpoint made from other settings, inputs or code; discarded")
                self.clear()  # never resume from it
                return None
            damaged = [
                name for name, digest in (state.get("checksums") or {}).items() if checksum(current / name) != digest
            ]
            if damaged or not state.get("checksums"):
                raise ArtifactError(f"{', '.join(damaged) or 'its checksums'}: missing or changed since written")
            self.count = int(current.name.split("-")[1])
            return state
        except (ArtifactError, OSError, ValueError, IndexError) as err:
            _say(f"[kdpipe] {self.root}: the checkpoint is damaged ({err}); discarded, training starts from scratch")
            self.clear()
            return None

    def save(self, state: dict, tensors: dict[str, dict], optimizer, scheduler, extra: dict | None = None) -> None:
        rng = distributed.gather(torch.get_rng_state())  # every process's (dropout masks differ by process)
        if self.root is None or not distributed.is_main():
            return
        self.count += 1
        folder = self.root / f"ckpt-{self.count:06d}"
        weights = sum(t.numel() * t.element_size() for sd in tensors.values() for t in sd.values())
        # AdamW keeps two moments per weight: the checkpoint holds about three times the weights
        ensure_disk_space(folder, 3 * weights, "a resume checkpoint", hint=FREE_SPACE)
        with atomic_path(folder, directory=True) as tmp:
            for name, sd in tensors.items():
                _save_state(sd, tmp / f"{name}.safetensors")
            torch.save(
                {
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "torch_rng": rng[0],
                    "torch_rngs": rng,
                    "extra": extra,
                },
                tmp / "optim.pt",
            )
            sums = {path.name: checksum(path) for path in sorted(tmp.iterdir())}
            write_json(tmp / "state.json", {**state, "resume_key": self.key, "checksums": sums})
        with atomic_path(self.root / "LATEST") as tmp:
            tmp.write_text(folder.name)
        for old in self.root.glob("ckpt-*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def tensors(self, name: str) -> dict:
        return load_file(str(self.current() / f"{name}.safetensors"))

    def holds(self, name: str) -> bool:
        return (self.current() / f"{name}.safetensors").is_file()

    def optim(self) -> dict:
        return torch.load(self.current() / "optim.pt", weights_only=True)

    def clear(self) -> None:
        if self.root is not None and self.root.exists():
            shutil.rmtree(self.root)


def read_resume_state(resume_dir: Path) -> dict | None:
    """The training state of the latest checkpoint in ``resume_dir`` (None when there is none).

    Safe to call while a job trains, e.g. to watch its progress: the job may write a newer checkpoint and remove the
    one ``LATEST`` named between the two reads here, and then the newer one is read."""
    checkpoint = _Checkpoint(resume_dir, "")
    while (current := checkpoint.current()) is not None:
        try:
            return read_json(current / "state.json")
        except ArtifactError:
            if checkpoint.current() == current:  # not replaced by a newer checkpoint: really missing
                raise
    return None


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
    every module (``best_state`` of ``model``, ``best_modules`` of the others).

    ``validate(model)`` returns a dict with a ``score`` (higher is better, e.g. accuracy) and optionally an ``nll``
    that breaks ties of the score (lower is better, :func:`is_better`); ``validate=None`` skips
    validation and keeps the last epoch's state (Meta-KD's first stage matches teacher features and trains no
    classifier, so accuracy cannot pick its best epoch). ``on_epoch(epoch,
    epochs)`` (0-based epoch) is called before each epoch's first step, also after a resume, so epoch-level
    schedules of a loss (e.g. Hydra+'s λ ramp) follow the same epochs.
    """
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
    lengths = train.lengths

    ckpt = _Checkpoint(resume_dir, resume_key)
    # the first process reads first: it removes a checkpoint of another configuration before the others look
    state = ckpt.load() if distributed.is_main() else None
    distributed.barrier()
    if not distributed.is_main():
        state = ckpt.load()
    if state:
        for name, (module, _) in modules.items():
            module.load_state_dict(ckpt.tensors(name))
        optim = ckpt.optim()
        optimizer.load_state_dict(optim["optimizer"])
        scheduler.load_state_dict(optim["scheduler"])
        rngs = optim.get("torch_rngs") or [optim["torch_rng"]]
        if distributed.rank() < len(rngs):  # (a process the checkpoint did not have keeps its seed)
            torch.set_rng_state(rngs[distributed.rank()])
        if extra_state is not None:
            extra_state.load_state_dict(optim["extra"])
        # (a checkpoint from before extra modules kept a best state has only the model's: the others keep their own)
        best = {
            name: ckpt.tensors(_best(name))
            if state["best_epoch"] >= 0 and ckpt.holds(_best(name))
            else state_on_cpu(module)
            for name, (module, _) in modules.items()
        }
        _say(f"[kdpipe] resuming {desc} at epoch {state['epoch']} step {state['step_in_epoch']}")
    else:
        state = {
            "epoch": 0,
            "step_in_epoch": 0,
            "best_score": -math.inf,
            "best_metrics": {},
            "best_epoch": -1,
            "history": [],
            "train_time_s": 0.0,
            "log_bytes": 0,  # a log left by an attempt killed before its first checkpoint is stale
        }
        best = {name: state_on_cpu(module) for name, (module, _) in modules.items()}
    if log_path and distributed.is_main():
        _rewind_log(Path(log_path), state.get("log_bytes"))
    log = open(log_path, "a") if log_path and distributed.is_main() else None  # noqa: SIM115 (closed below)
    params = [p for g in optimizer.param_groups for p in g["params"]]

    def checkpoint():
        state["log_bytes"] = log.tell() if log else None  # the log as of this checkpoint (see _rewind_log)
        tensors = {}
        if distributed.is_main():  # (the others only join in gathering the random-number states)
            tensors = {name: state_on_cpu(m) for name, (m, _) in modules.items()}
            tensors.update({_best(name): sd for name, sd in best.items()})
        ckpt.save(state, tensors, optimizer, scheduler, extra_state.state_dict() if extra_state is not None else None)

    def write_log(record: dict):
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()

    try:
        while state["epoch"] < settings.epochs:
            epoch = state["epoch"]
            batches = training_batches(lengths, settings.batch_size, seed=settings.seed, epoch=epoch)
            if on_epoch is not None:
                on_epoch(epoch, settings.epochs)
            for module, _ in modules.values():
                module.train()
            started = time.perf_counter()
            bar = tqdm(
                total=len(batches),
                initial=state["step_in_epoch"],
                desc=f"{desc} epoch {epoch + 1}/{settings.epochs}",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=5,
                disable=not distributed.is_main(),
            )
            for step in range(state["step_in_epoch"], len(batches)):
                rows, share = distributed.shard(batches[step])  # all rows with one process
                distributed.set_share(share)
                batch = collate(train, rows, device)
                optimizer.zero_grad(set_to_none=True)  # (before the loss: ProKT's steps its own teacher inside it)
                with autocast(device):
                    loss, terms = loss_fn(model, batch)
                loss_value = distributed.sync_backward(loss, params)
                if not math.isfinite(loss_value):
                    raise FloatingPointError(f"{desc}: loss is {loss_value} at epoch {epoch + 1} step {step}")
                torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
                optimizer.step()
                scheduler.step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", refresh=False)
                state["step_in_epoch"] = step + 1
                if step % settings.log_every == 0:
                    write_log(
                        {
                            "epoch": epoch + 1,
                            "step": step,
                            "loss": loss_value,
                            "lr": scheduler.get_last_lr()[0],
                            **terms,
                        }
                    )
                if settings.checkpoint_every and (step + 1) % settings.checkpoint_every == 0:
                    state["train_time_s"] += time.perf_counter() - started
                    started = time.perf_counter()
                    checkpoint()
            bar.close()
            state["train_time_s"] += time.perf_counter() - started
            for module, _ in modules.values():
                module.eval()
            # None: keep the last epoch. Every process validates (same weights); the first one's metrics decide
            metrics = distributed.broadcast(validate(model)) if validate is not None else None
            improved = metrics is None or is_better(metrics, state["best_score"], state["best_metrics"])
            if improved:
                state.update(
                    best_score=metrics["score"] if metrics else -math.inf,
                    best_metrics=metrics or {},
                    best_epoch=epoch + 1,
                )
                best = {name: state_on_cpu(module) for name, (module, _) in modules.items()}
            record = {
                "epoch": epoch + 1,
                "validation": metrics,
                "best": improved,
                "train_time_s": round(state["train_time_s"], 2),
            }
            state["history"].append(record)
            write_log(record)
            _say(f"[kdpipe] {desc} epoch {epoch + 1}: validation {metrics if metrics else 'skipped'}")
            state.update(epoch=epoch + 1, step_in_epoch=0)
            checkpoint()
    finally:
        if log:
            log.close()
    return FitResult(
        best_state=best["model"],
        best_metrics=state["best_metrics"],
        best_epoch=state["best_epoch"],
        history=state["history"],
        train_time_s=state["train_time_s"],
        best_modules={name: sd for name, sd in best.items() if name != "model"},
    )


def _rewind_log(path: Path, size: int | None) -> None:
    """Cut the training log back to ``size`` bytes, its length at the checkpoint a run resumes from: records written
    after that checkpoint (a kill between an epoch's log line and its checkpoint) are written again by the resumed
    steps, and must not appear twice. Nothing for a fresh run or a checkpoint that did not record it."""
    if size is not None and path.is_file() and path.stat().st_size > size:
        with open(path, "r+") as fh:
            fh.truncate(size)


def _say(message: str) -> None:
    if distributed.is_main():
        print(message, file=sys.stderr)


def is_better(metrics: dict, best_score: float, best_metrics: dict) -> bool:
    """Whether an epoch's validation ``metrics`` beat the kept best (``best_score``, ``best_metrics``): a higher
    ``score``, or an equal score and a lower ``nll`` when both have one (docs/design.md, "Style": a later epoch that
    ties on accuracy replaces the kept one when it is better calibrated)."""
    if metrics["score"] != best_score:
        return metrics["score"] > best_score
    return "nll" in metrics and best_metrics.get("nll") is not None and metrics["nll"] < best_metrics["nll"]


def _best(name: str) -> str:
    """The checkpoint entry of a module's best state ("best" for the model, as before extra modules had one)."""
    return "best" if name == "model" else f"best.{name}"


def fit_job(
    model: nn.Module,
    objective,
    train: Encoded,
    validate: Callable[[nn.Module], dict] | None,
    settings: TrainSettings,
    device: torch.device,
    *,
    out_dir: Path,
    params: dict,
    desc: str,
) -> FitResult:
    """:func:`fit` for a stage job writing ``out_dir``: its :class:`~kdpipe.training.objective.Objective` (loss,
    extra modules, epoch hook, extra state), with the resume folder and training log beside the output. The resume
    key is the job's identity (:func:`kdpipe.core.identity.job_identity`: settings, local files, input artifacts,
    code, library versions), set by the command line; a stage called directly keys on its config slice ``params``.
    A checkpoint of another key is discarded, never resumed."""
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
        resume_key=job_identity_of_process() or json.dumps(params, sort_keys=True),
        extra_modules=objective.extra_modules,
        on_epoch=objective.on_epoch,
        extra_state=objective.extra_state,
        desc=desc,
    )


def work_paths(out_dir: Path) -> tuple[Path, Path]:
    """The resume directory and the JSONL training log of the job writing ``out_dir``.

    Both live beside the output, outside it (Snakemake deletes declared outputs before a rerun); the log is appended
    to across resumes and moved into the output by :func:`finish`.
    """
    out_dir = Path(out_dir)
    work = work_dir(out_dir)
    work.mkdir(parents=True, exist_ok=True)
    return work / out_dir.name, work / f"{out_dir.name}.train_log.jsonl"


def finish(out_tmp: Path, out_dir: Path) -> None:
    """Keep a copy of the finished (temporary) output dir beside it with the job's identity, and drop the resume
    state: if Snakemake, stopped meanwhile, deletes the output as incomplete, the rerun restores it at once
    (:func:`kdpipe.core.finished.restore_finished`) instead of training again."""
    resume, _ = work_paths(out_dir)
    keep_finished(out_tmp, Path(out_dir))
    _Checkpoint(resume, "").clear()


def encoded_validator(encoded: Encoded, *, batch_size: int, device: torch.device):
    """``validate`` for a model that predicts ``encoded``'s labels: accuracy of its eval-mode probabilities."""
    return accuracy_validator(probs_predictor(encoded, batch_size=batch_size, device=device), encoded.labels)


def accuracy_validator(predict_probs: Callable[[nn.Module], np.ndarray], labels: np.ndarray):
    """``validate`` for classification: score = accuracy of ``predict_probs(model)`` against ``labels``."""

    def validate(model: nn.Module) -> dict:
        probs = predict_probs(model)
        acc = float((probs.argmax(1) == labels).mean()) if len(labels) else 0.0
        nll = float(-np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-12, None)).mean()) if len(labels) else 0.0
        return {"score": acc, "accuracy": acc, "nll": nll}

    return validate


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
    """Write a trained model's directory atomically: the best weights (safetensors) and tokenizer (whose
    ``model_max_length`` is the training ``max_length``, so a pipeline truncates as kdpipe did), ``labels.json``
    (output order), ``metrics.json`` (best validation, train time, params, history), ``manifest.json``, a model
    card ``README.md``, ``train_log.jsonl`` and whatever ``save_extra(folder, result)`` adds; then drop the resume
    state. Only the first process of a multi-process job writes."""
    if not distributed.is_main():
        return
    model.load_state_dict(result.best_state)
    max_length = (manifest.get("config") or {}).get("max_length")
    if max_length:
        tokenizer.model_max_length = int(max_length)
    metrics = {
        "best_epoch": result.best_epoch,
        "validation": result.best_metrics,
        "train_time_s": result.train_time_s,
        "params": count_parameters(model),
        "history": result.history,
    }
    ensure_disk_space(out_dir, tensor_bytes(model) + (64 << 20), f"the model folder {out_dir}", hint=FREE_SPACE)
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
