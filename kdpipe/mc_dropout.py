"""The ``mc_dropout`` stage: offline MC-dropout uncertainty of a teacher on a split (METHODS.md §1).

T stochastic passes with dropout on and everything else in eval mode. The T samples of a batch run as one
enlarged batch of T·B rows (split into chunks of at most ``max_batch_rows`` rows and ``MAX_BATCH_TOKENS``
tokens), under
``torch.inference_mode()``. The RNG is re-seeded per batch from ``(seed, first row_id of the batch)``, so a fixed
seed reproduces the samples exactly whatever the order the batches run in.

Outputs: the mean probabilities p̄ (``mc.npy``, float32 [N, C_teacher], row_id order, written through
``open_memmap`` so memory stays flat in N) and per-row scores (``mc.parquet``): normalised entropy H(p̄)/log C,
MUKI's certainty score u = 1 − H(p̄)/log C, max p̄, and the variance of the sampled probabilities (mean over
classes of the per-class variance across the T samples).

Note: MUKI's released ``run_mc.py`` never switched dropout on, so its 16 passes were identical; here dropout is
enabled explicitly (:func:`enable_dropout`) and a test checks that samples differ.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from numpy.lib.format import open_memmap
from torch import nn

from kdpipe.batching import Encoded, model_inputs
from kdpipe.device import autocast, pick_device
from kdpipe.inference import iterate
from kdpipe.signals import manifest_path
from kdpipe.store import atomic_path, make_manifest, write_json
from kdpipe.teacher_inputs import open_teacher


def enable_dropout(model: nn.Module) -> nn.Module:
    """Eval mode everywhere except dropout: ``nn.Dropout`` modules and attention modules (whose attention-prob
    dropout is functional and gated on the attention module's own ``training`` flag in transformers)."""
    model.eval()
    for module in model.modules():
        if isinstance(module, nn.Dropout) or type(module).__name__.endswith("Attention"):
            module.train()
    return model


MAX_BATCH_TOKENS = 16384


def batch_seed(seed: int, first_row_id: int) -> int:
    return (seed * 1_000_003 + int(first_row_id)) % (2**63 - 1)


@torch.inference_mode()
def mc_dropout_samples(model: nn.Module, batch: dict, *, samples: int, seed: int, max_batch_rows: int,
                       device: torch.device) -> torch.Tensor:
    """Softmax probabilities of ``samples`` dropout-on passes over one batch: [T, B, C] float32."""
    inputs = model_inputs(batch)
    rows, width = inputs["input_ids"].shape
    # the enlarged batch is bounded in rows and in tokens: long rows make activations (and attention, quadratic
    # in the width) large, and on a CPU an oversized batch is slower per row than a smaller one
    per_pass = max(1, min(max_batch_rows // rows, MAX_BATCH_TOKENS // (rows * width)))
    torch.manual_seed(batch_seed(seed, int(batch["row_ids"].min())))
    chunks = []
    for start in range(0, samples, per_pass):
        k = min(per_pass, samples - start)
        enlarged = {name: t.repeat(k, 1) for name, t in inputs.items()}
        with autocast(device):
            logits = model(**enlarged).logits
        chunks.append(torch.softmax(logits.float(), -1).view(k, rows, -1))
    return torch.cat(chunks)


def summarise(samples: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-row mean probabilities and scores from [T, B, C] samples."""
    mean = samples.mean(0)
    classes = mean.shape[-1]
    entropy = -(mean * torch.log(mean.clamp_min(1e-12))).sum(-1)
    norm_entropy = entropy / math.log(classes) if classes > 1 else torch.zeros_like(entropy)
    return {"mean": mean, "entropy": norm_entropy, "certainty": 1.0 - norm_entropy,
            "max_prob": mean.max(-1).values, "variance": samples.var(0, unbiased=False).mean(-1)}


def mc_dropout(model: nn.Module, encoded: Encoded, *, samples: int, seed: int, batch_size: int,
               max_batch_rows: int, device: torch.device, out_npy: Path | None = None, desc: str | None = None):
    """Run MC-dropout over a split; returns (mean probs [N, C] (a memmap when ``out_npy``), score DataFrame)."""
    model.to(device)
    enable_dropout(model)
    n, classes = len(encoded), model.config.num_labels
    mean = (open_memmap(out_npy, mode="w+", dtype=np.float32, shape=(n, classes)) if out_npy
            else np.zeros((n, classes), np.float32))
    scores = {k: np.zeros(n, np.float32) for k in ("entropy", "certainty", "max_prob", "variance")}
    row_ids = torch.as_tensor(np.array(encoded.row_ids))
    for batch in iterate(encoded, batch_size, device, desc):
        index = batch["index"].cpu()
        batch["row_ids"] = row_ids[index]
        summary = summarise(mc_dropout_samples(model, batch, samples=samples, seed=seed,
                                               max_batch_rows=max_batch_rows, device=device))
        mean[index.numpy()] = summary["mean"].cpu().numpy()
        for key in scores:
            scores[key][index.numpy()] = summary[key].cpu().numpy()
    if out_npy:
        mean.flush()
    return mean, pd.DataFrame({"row_id": encoded.row_ids, **scores})


def run(params: dict, teacher_dir: Path, data_dir: Path, out_npy: Path, out_parquet: Path) -> dict:
    """The stage: writes ``mc.npy``, ``mc.parquet`` and ``mc.json`` (manifest), each atomically."""
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"])
    started = time.perf_counter()
    with atomic_path(out_npy) as tmp_npy, atomic_path(out_parquet) as tmp_parquet:
        _, scores = mc_dropout(teacher.model, teacher.encoded, samples=params["samples"], seed=params["seed"],
                               batch_size=params["batch_size"], max_batch_rows=params["max_batch_rows"],
                               device=device, out_npy=tmp_npy, desc=f"mc-dropout {params['split']}")
        scores.to_parquet(tmp_parquet, index=False)
    manifest = make_manifest("mc_dropout", config=params, split=params["split"], rows=len(scores),
                             labels=teacher.labels, teacher=teacher.teacher_config,
                             seconds=round(time.perf_counter() - started, 2))
    write_json(manifest_path(out_npy), manifest)
    return manifest
