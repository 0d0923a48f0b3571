"""The ``distill`` stage: train one student from cached teacher signals only (docs/design.md, "Data flow").

The student never sees a teacher model: it reads the signals its method declares (``kdpipe.methods.registry``)
from ``{signals_root}/{teacher}/train/``, keyed by row_id (so its tokenizer may differ from the teachers' for
logit-level methods), restricted to its rows (those of its ``domain``) and followed by the transfer split's when it
learns from transfer rows (docs/methods.md, "Rows without a gold label"). The one exception: a student with
``signals: online`` runs its teachers here for their hidden states and attentions (kdpipe.signals.online).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import torch

from kdpipe.core.store import KdpipeError, make_manifest
from kdpipe.data.batching import without_texts
from kdpipe.data.dataset import domain_ids
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.methods.base import DistillContext
from kdpipe.methods.settings import StudentSettings
from kdpipe.methods.started_labels import started_label_use
from kdpipe.routing.artifact import read_route
from kdpipe.routing.diagnostics import say_route_warning
from kdpipe.signals.io import read_prototype_scores
from kdpipe.signals.load import join_parts, load_signals, subset_signals
from kdpipe.training.loop import fit_job, save_trained
from kdpipe.training.student import student_data


def run(
    settings: StudentSettings,
    data: Path,
    signals_root: Path,
    out: Path,
    prototypes: Path | None = None,
    route: Path | None = None,
    transfer: Path | None = None,
    teacher_dirs: list[Path] = (),
    warn_below: str | None = None,
) -> dict:
    """Train the student of ``settings`` from the cached signals under ``signals_root``; write it to ``out``. A
    student that reads a ``route`` first says its routing warning at ``warn_below``, as the route job did (a route
    linked from the shared cache ran no job here)."""
    say_route_warning(route, warn_below)
    spec = settings.method_spec
    attn = "eager" if "attentions" in spec.signals else None
    job = student_data(data, settings, attn=attn, transfer_dir=transfer)
    signals = teacher_signals(settings, job, Path(signals_root), teacher_dirs)
    ctx = context(settings, job, signals, prototypes)
    route_manifest = routed(ctx, settings.method, job, route) if spec.routed else None
    builder = getattr(importlib.import_module(spec.module), spec.builder)
    result = fit_job(
        job.model,
        builder(ctx, settings.method_args),
        job.enc_train,
        job.validator(settings.eval_batch_size),
        job.settings,
        job.device,
        out_dir=out,
        job=settings,
        desc=f"student ({settings.method})",
    )
    transfer_rows = {} if job.transfer is None else {"transfer": len(job.transfer)}
    manifest = make_manifest(
        "student",
        config=settings,
        labels=job.labels,
        method=settings.method,
        teachers=ctx.teachers,
        tokenizer=settings.model.to_dict(),
        domain=settings.domain,
        rows={"train": len(job.train), **transfer_rows, "validation": len(job.valid)},
        # what its route, Meta-KD's example weights and its starting model read (training adds its own)
        gold_labels=started_label_use(settings.model.init_from, spec, len(job.train), route_manifest, prototypes),
    )
    save_trained(out, job.model, job.tokenizer, job.labels, result, manifest)
    return manifest


def context(settings: StudentSettings, job, signals: dict, prototypes: Path | None) -> DistillContext:
    """What the method receives: its teachers' signals and class blocks, the layer alignment of a method that reads
    hidden states, the student's rows, their domains and Meta-KD's prototype scores."""
    method, teachers = settings.method_spec, list(settings.teachers)
    where = f"student with method {settings.method}"
    labels = {t: signals[t]["labels"] for t in teachers}  # (none for a baseline without teachers: method supervised)
    ctx = DistillContext(
        labels=job.labels,
        teachers=teachers,
        blocks=teacher_blocks(labels, job.labels, policy=method.teacher_classes, where=where) if teachers else {},
        signals=signals,
        device=job.device,
        student_config=job.model.config,
        train_lengths=job.enc_train.lengths,
        train_tokens=job.enc_train.token_hashes,
        alignment=settings.alignment,
        domains=job.domains,
    )
    if job.domains and job.transfer is None:  # transfer rows have no domain (no method reading domains takes them)
        ctx.domain_ids = torch.as_tensor(domain_ids(job.train, job.domains), device=job.device)
    if method.prototypes:
        if prototypes is None:
            raise KdpipeError(f"method {settings.method} reads the prototype scores: pass --prototypes")
        scores = read_prototype_scores(prototypes, job.split_row_ids)[job.train_positions]
        ctx.prototype_scores = torch.as_tensor(scores, device=job.device)
    ctx.train_labels = job.enc_train.labels
    return ctx


def teacher_signals(settings: StudentSettings, job, signals_root: Path, teacher_dirs: list[Path]) -> dict[str, dict]:
    """Each teacher's signals of the student's train (and transfer) rows, read from the cache; with ``signals:
    online`` the teachers of ``teacher_dirs`` compute the token-level ones here. The texts go once tokenised."""
    online = importlib.import_module("kdpipe.signals.online") if settings.signals == "online" else None
    computed = {}
    if online:
        computed = online.online_signals(
            settings.method_spec.signals,
            teacher_dirs,
            job,
            teachers=settings.teachers,
            alignment=settings.alignment,
            attention_feature=settings.attention_feature,
        )
    cached = tuple(n for n in settings.method_spec.signals if not online or n not in online.ONLINE)
    for name in ("train", "valid", "transfer"):
        setattr(job, name, None if getattr(job, name) is None else without_texts(getattr(job, name)))
    feature = settings.attention_feature or "attentions"

    def read(teacher: str, part) -> dict:
        found = load_signals(cached, signals_root / teacher / part.split, part.split_row_ids, job.device, feature)
        return subset_signals(found, part.positions)

    return {
        t: computed.get(t, {}) | join_parts([read(t, part) for part in job.parts], f"{signals_root}/{t}")
        for t in settings.teachers
    }


def routed(ctx: DistillContext, method: str, job, route: Path | None) -> dict:
    """Each row's teacher weights from the route (``ctx.route``); returns the route's manifest."""
    if route is None:
        raise KdpipeError(f"method {method} weighs its teachers by a route: pass --route")
    scores, manifests = zip(*(read_route(route, p.split, p.split_row_ids, ctx.teachers) for p in job.parts))
    scores = np.concatenate([split_scores[p.positions] for split_scores, p in zip(scores, job.parts)])
    manifest = manifests[0]
    ctx.route = {"scores": torch.as_tensor(scores, device=job.device), "weighting": manifest["weighting"]}
    ctx.route["temperatures"] = manifest.get("temperatures")
    return manifest
