"""The ``distill`` stage: train one student from cached teacher signals only (docs/design.md, "Data flow").

The student never sees a teacher model: it reads the signals its method declares (``kdpipe.methods.registry``)
from ``{signals_root}/{teacher}/train/``, checked against their manifests and the data split. Signals are keyed by
row_id, not by token, so the student's tokenizer may differ from the teachers' for logit-level methods. A student
restricted to a ``domain`` trains on that domain's rows and reads the same cached signals (made once for all rows),
restricted to those rows. A student that learns from transfer rows (``params["transfer"]``) reads each teacher's
signals on the transfer split too, joined after the train rows' (kdpipe.signals.join); those rows carry no gold
label (docs/methods.md, "Rows without a gold label"). The one exception to "never a teacher model": a student with
``signals: online`` runs its teachers here for their hidden states and attentions (kdpipe.signals.online).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from kdpipe.core.store import KdpipeError, make_manifest
from kdpipe.data.batching import without_texts
from kdpipe.data.dataset import domain_ids
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.methods.base import DistillContext
from kdpipe.routing.artifact import read_route
from kdpipe.routing.diagnostics import say_route_warning
from kdpipe.signals.io import read_prototype_scores
from kdpipe.signals.join import join_parts
from kdpipe.signals.load import load_signals, subset_signals
from kdpipe.training.loop import fit_job, save_trained
from kdpipe.training.started_labels import started_label_use
from kdpipe.training.student import student_data


def run(
    params: dict,
    data: Path,
    signals_root: Path,
    out: Path,
    prototypes: Path | None = None,
    route: Path | None = None,
    transfer: Path | None = None,
    teacher_dirs: list[Path] = (),
    warn_below: str | None = None,
) -> dict:
    """Train the student of ``params`` from the cached signals under ``signals_root``; write it to ``out``. A student
    that reads a ``route`` first says its routing warning at ``warn_below`` (``routing.warn_below``, outside the
    slice), as the route job did: a route linked from the shared cache ran no job here.

    ``params["method_spec"]`` is what the registry says of the method (module, builder, signals, teacher_classes,
    prototypes), passed by the plan so that this stage imports only the method's own module.
    """
    say_route_warning(route, warn_below)
    method = SimpleNamespace(name=params["method"], **{"routed": False, **params["method_spec"]})
    job = student_data(params, data, attn="eager" if "attentions" in method.signals else None, transfer_dir=transfer)
    # signals: online (kdpipe.signals.online, imported by name): the teachers of ``teacher_dirs`` compute the
    # token-level signals here, from the rows' texts; everything else is read from the cache
    online = importlib.import_module("kdpipe.signals.online") if params.get("signals") == "online" else None
    computed = online.online_signals(params, method.signals, teacher_dirs, job) if online else {}
    cached = online.cached_signals(method.signals) if online else method.signals
    for name in ("train", "valid", "transfer"):  # tokenised: the texts go (memory flat in N)
        setattr(job, name, None if getattr(job, name) is None else without_texts(getattr(job, name)))
    device, labels = job.device, job.labels
    teachers = list(params["teachers"])
    positions = job.train_positions
    signals = {
        t: computed.get(t, {})
        | join_parts(
            [
                subset_signals(
                    load_signals(
                        cached,
                        Path(signals_root) / t / part.split,
                        part.split_row_ids,
                        device,
                        params.get("attention_feature", "attentions"),
                    ),
                    part.positions,
                )
                for part in job.parts
            ],
            f"{signals_root}/{t}",
        )
        for t in teachers
    }
    blocks = (
        teacher_blocks(
            {t: signals[t]["labels"] for t in teachers},
            labels,
            policy=method.teacher_classes,
            where=f"student with method {method.name}",
        )
        if teachers
        else {}  # a baseline without teachers (method supervised)
    )
    ctx = DistillContext(
        labels=labels,
        teachers=teachers,
        blocks=blocks,
        signals=signals,
        device=device,
        student_config=job.model.config,
        train_lengths=job.enc_train.lengths,
        train_tokens=job.enc_train.token_hashes,
        alignment=params.get("alignment"),
        domains=job.domains,
    )
    if job.domains and job.transfer is None:  # transfer rows have no domain (no method reading domains takes them)
        ctx.domain_ids = torch.as_tensor(domain_ids(job.train, job.domains), device=device)
    if method.prototypes:
        if prototypes is None:
            raise KdpipeError(f"method {method.name} reads the prototype scores: pass --prototypes")
        scores = read_prototype_scores(prototypes, job.split_row_ids)[positions]
        ctx.prototype_scores = torch.as_tensor(scores, device=device)
    ctx.train_labels = job.enc_train.labels
    if method.routed:
        if route is None:
            raise KdpipeError(f"method {method.name} weighs its teachers by a route: pass --route")
        scores, manifest = zip(*(read_route(route, p.split, p.split_row_ids, teachers) for p in job.parts))
        scores = np.concatenate([split_scores[p.positions] for split_scores, p in zip(scores, job.parts)])
        route_manifest = manifest[0]
        ctx.route = {
            "scores": torch.as_tensor(scores, device=device),
            "weighting": route_manifest["weighting"],
            "temperatures": route_manifest.get("temperatures"),
        }
    else:
        route_manifest = None
    # what its route, Meta-KD's example weights and its starting model read
    # (docs/report.md, "Which gold labels each model read")
    started = started_label_use(params, method, len(job.train), route_manifest, prototypes)
    builder = getattr(importlib.import_module(method.module), method.builder)
    objective = builder(ctx, params["method_args"])
    result = fit_job(
        job.model,
        objective,
        job.enc_train,
        job.validator(params.get("eval_batch_size", 64)),
        job.settings,
        device,
        out_dir=out,
        params=params,
        desc=f"student ({method.name})",
    )
    manifest = make_manifest(
        "student",
        config=params,
        labels=labels,
        method=method.name,
        teachers=teachers,
        tokenizer=params["model"],
        domain=params.get("domain"),
        rows={
            "train": len(job.train),
            **({"transfer": len(job.transfer)} if job.transfer is not None else {}),
            "validation": len(job.valid),
        },
        gold_labels=started,  # with what training reads (kdpipe.training.loop.label_use)
    )
    save_trained(out, job.model, job.tokenizer, labels, result, manifest)
    return manifest
