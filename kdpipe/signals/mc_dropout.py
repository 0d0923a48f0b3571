"""The ``mc`` signal: offline MC-dropout uncertainty of a teacher on a split (docs/methods.md §1).

T passes with dropout on and everything else in eval mode, run as one enlarged batch of T·B rows (in chunks), the
RNG re-seeded per batch from ``(seed, smallest row_id of the batch)`` (docs/design.md, "Signals"). Outputs: the mean
probabilities (``mc.npy``) and per-row scores (``mc.parquet``; docs/routing.md, "Certainty scores"); every entropy is
:func:`kdpipe.evaluation.information.normalized_entropy`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch import nn

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast, pick_device
from kdpipe.core.store import KdpipeError, atomic_path, ensure_disk_space, make_manifest
from kdpipe.data.batching import WHOLE, Encoded, model_inputs
from kdpipe.evaluation.information import normalized_entropy
from kdpipe.models.inference import dropout_rates, enable_dropout, iterate, pass_batches
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.parts import gather_array, shard_rows
from kdpipe.signals.settings import SignalSettings
from kdpipe.signals.teacher import open_teacher

SCORES = ("entropy", "certainty", "max_prob", "variance", "mean_entropy", "mutual_info")


def set_dropout(model: nn.Module, rate: float | None, where: str) -> nn.Module:
    """Set every dropout probability to ``rate``; without it, refuse a model without dropout (equal samples)."""
    if rate is not None:
        for module in model.modules():
            if isinstance(module, nn.Dropout):
                module.p = float(rate)
            for attr, value in vars(module).items():
                if "dropout" in attr and isinstance(value, float):
                    setattr(module, attr, float(rate))
        return model
    if not any(r > 0 for r in dropout_rates(model)):
        raise KdpipeError(
            f"{where}: the teacher's dropout is zero everywhere, so MC-dropout samples would all be equal; set "
            "mc_dropout.dropout (e.g. 0.1) to sample with that dropout rate"
        )
    return model


# The enlarged batch's bound in tokens (and max_batch_rows in rows): long rows make activations (and attention,
# quadratic in the width) large, and on a CPU an oversized batch is slower per row than a smaller one
MAX_BATCH_TOKENS = 16384


@torch.inference_mode()
def mc_dropout_samples(
    model: nn.Module, batch: dict, *, samples: int, seed: int, max_batch_rows: int, device: torch.device
) -> torch.Tensor:
    """Softmax probabilities of ``samples`` dropout-on passes over one batch: [T, B, C] float32."""
    inputs = model_inputs(batch)
    rows, width = inputs["input_ids"].shape
    per_pass = max(1, min(max_batch_rows // rows, MAX_BATCH_TOKENS // (rows * width)))
    torch.manual_seed((seed * 1_000_003 + int(batch["row_ids"].min())) % (2**63 - 1))
    chunks = []
    for start in range(0, samples, per_pass):
        k = min(per_pass, samples - start)
        enlarged = {name: t.repeat(k, 1) for name, t in inputs.items()}
        with autocast(device):
            logits = model(**enlarged).logits
        chunks.append(torch.softmax(logits.float(), -1).view(k, rows, -1))
    return torch.cat(chunks)


def summarise(samples: torch.Tensor) -> dict[str, np.ndarray]:
    """Per-row mean probabilities and scores from [T, B, C] samples, float32 (docs/routing.md, "Certainty scores")."""
    mean = samples.mean(0)
    norm_entropy = normalized_entropy(mean.cpu().numpy())
    mean_entropy = normalized_entropy(samples.cpu().numpy()).mean(0)
    return {
        "mean": mean.cpu().numpy(),
        "entropy": norm_entropy,
        "certainty": 1.0 - norm_entropy,
        "max_prob": mean.max(-1).values.cpu().numpy(),
        "variance": samples.var(0, unbiased=False).mean(-1).cpu().numpy(),
        "mean_entropy": mean_entropy,
        # H(p̄) ≥ mean H(p_t) by concavity; the clip only removes float rounding below zero
        "mutual_info": np.clip(norm_entropy - mean_entropy, 0.0, None),
    }


def mc_dropout(
    model: nn.Module,
    encoded: Encoded,
    *,
    samples: int,
    seed: int,
    batch_size: int,
    max_batch_rows: int,
    device: torch.device,
    desc: str | None = None,
    shard: tuple[int, int] = WHOLE,
):
    """MC-dropout over a split (a shard fills its rows): mean probabilities [N, C] and the score DataFrame."""
    model.to(device)
    enable_dropout(model)
    n, classes = len(encoded), model.config.num_labels
    mean = np.zeros((n, classes), np.float32)
    scores = {k: np.zeros(n, np.float32) for k in SCORES}
    row_ids = torch.as_tensor(np.array(encoded.row_ids))
    for batch in iterate(encoded, batch_size, device, desc, shard):
        index = batch["index"].cpu()
        batch["row_ids"] = row_ids[index]
        summary = summarise(
            mc_dropout_samples(model, batch, samples=samples, seed=seed, max_batch_rows=max_batch_rows, device=device)
        )
        mean[index.numpy()] = summary["mean"]
        for key in scores:
            scores[key][index.numpy()] = summary[key]
    return mean, pd.DataFrame({"row_id": encoded.row_ids, **scores})


def compute(settings: SignalSettings, teacher_dir: Path, data_dir: Path, shard: tuple[int, int], part: Path):
    """Write the shard's mean probabilities and scores into the part folder; return (rows, manifest fields)."""
    teacher = open_teacher(teacher_dir, data_dir, settings.split)
    set_dropout(teacher.model, settings.dropout, str(teacher_dir))
    mean, scores = mc_dropout(
        teacher.model,
        teacher.encoded,
        samples=settings.samples,
        seed=settings.seed,
        batch_size=settings.batch_size,
        max_batch_rows=settings.max_batch_rows,
        device=pick_device(),
        desc=f"mc-dropout {settings.split}",
        shard=shard,
    )
    rows = shard_rows(pass_batches(teacher.encoded, settings.batch_size, shard))
    for name, values in {"mean": mean, **scores}.items():  # and row_id and every score, the columns of scores
        np.save(part / f"{name}.npy", np.asarray(values)[rows])
    return rows, {"rows": len(teacher.encoded), "labels": teacher.labels, "teacher": teacher.teacher_config}


def write(settings: SignalSettings, meta: dict, parts, out_dir: Path) -> dict:
    """``mc.npy``, ``mc.parquet`` and ``mc.json`` in ``out_dir`` from every shard's part."""
    npy, parquet, manifest_file = (out_dir / name for name in SIGNALS["mc"].files)
    ensure_disk_space(
        npy, 4 * meta["rows"] * (len(meta["labels"]) + 2 * len(SCORES)), "the MC-dropout signal", "free space"
    )

    def column(name):
        return gather_array(parts, name, meta["rows"])

    with atomic_path(npy) as tmp, open(tmp, "wb") as fh:  # a file object: np.save would add ".npy"
        np.save(fh, column("mean"))
    with atomic_path(parquet) as tmp:
        pd.DataFrame({"row_id": column("row_id"), **{key: column(key) for key in SCORES}}).to_parquet(tmp, index=False)
    manifest = make_manifest("mc", config=settings, split=settings.split, **meta)
    return write_manifest(manifest_file, manifest, [npy.name, parquet.name])
