"""The ``distill`` stage: train one student from cached teacher signals only (docs/design.md, "Data flow").

The student never sees a teacher model: it reads the signals its method declares (``kdpipe.methods.registry``)
from ``{signals_root}/{teacher}/train/``, checked against their manifests and the data split. Signals are keyed by
row_id, not by token, so the student's tokenizer may differ from the teachers' for logit-level methods. A student
restricted to a ``domain`` trains on that domain's rows and reads the same cached signals (made once for all rows),
restricted to those rows.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace

import torch

from kdpipe.core.store import KdpipeError, make_manifest
from kdpipe.data.dataset import domain_ids
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.methods.base import DistillContext
from kdpipe.signals.io import read_prototype_scores
from kdpipe.signals.load import load_signals, subset_signals
from kdpipe.training.loop import fit_job, save_trained
from kdpipe.training.student import student_data


def run(params: dict, data: Path, signals_root: Path, out: Path, prototypes: Path | None = None) -> dict:
    """Train the student of ``params`` from the cached signals under ``signals_root``; write it to ``out``.

    ``params["method_spec"]`` is what the registry says of the method (module, builder, signals, teacher_classes,
    prototypes), passed by the plan so that this stage imports only the method's own module.
    """
    method = SimpleNamespace(name=params["method"], **params["method_spec"])
    data_dir, out_dir = data, out
    data = student_data(params, data_dir, attn="eager" if "attentions" in method.signals else None)
    device, labels = data.device, data.labels
    teachers = list(params["teachers"])
    positions = data.train_positions
    signals = {
        t: subset_signals(
            load_signals(
                method.signals,
                Path(signals_root) / t / "train",
                data.split_row_ids,
                device,
                params.get("attention_feature", "attentions"),
            ),
            positions,
        )
        for t in teachers
    }
    blocks = teacher_blocks(
        {t: signals[t]["labels"] for t in teachers},
        labels,
        policy=method.teacher_classes,
        where=f"student with method {method.name}",
    )
    ctx = DistillContext(
        labels=labels,
        teachers=teachers,
        blocks=blocks,
        signals=signals,
        device=device,
        student_config=data.model.config,
        train_lengths=data.enc_train.lengths,
        alignment=params.get("alignment"),
        domains=data.domains,
    )
    if data.domains:
        ctx.domain_ids = torch.as_tensor(domain_ids(data.train, data.domains), device=device)
    if method.prototypes:
        if prototypes is None:
            raise KdpipeError(f"method {method.name} reads the prototype scores: pass --prototypes")
        scores = read_prototype_scores(prototypes, data.split_row_ids)[positions]
        ctx.prototype_scores = torch.as_tensor(scores, device=device)
    builder = getattr(importlib.import_module(method.module), method.builder)
    objective = builder(ctx, params["method_args"])
    result = fit_job(
        data.model,
        objective,
        data.enc_train,
        data.validator(params.get("eval_batch_size", 64)),
        data.settings,
        device,
        out_dir=out_dir,
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
        rows={"train": len(data.train), "validation": len(data.valid)},
    )
    save_trained(out_dir, data.model, data.tokenizer, labels, result, manifest)
    return manifest
