"""The ``pooled`` signal: each row's mean last-layer hidden state under a teacher, float32 [N, H].

The small feature the feature-space routers read (docs/routing.md, "Routers"): the mean over the row's own tokens
(padding excluded) of the teacher's last hidden layer, the layer its classifier reads. Unlike the token-level
``hidden`` dump it is one vector per row, so it costs 4·H bytes per example whatever the length.
``pooled.npy`` (row_id order of the split) + ``pooled.json``; runs as S shards gathered into the same bytes as one
pass (:mod:`kdpipe.signals.shards`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast, pick_device
from kdpipe.core.store import atomic_path, ensure_disk_space, make_manifest
from kdpipe.data.batching import WHOLE, Encoded, model_inputs
from kdpipe.models.inference import iterate, pass_batches
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.shards import gather_array, shard_rows
from kdpipe.signals.teacher import open_teacher


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the tokens whose mask is 1: [B, S, H], [B, S] -> [B, H] (float32)."""
    weights = mask.to(torch.float32).unsqueeze(-1)
    return (hidden.float() * weights).sum(1) / weights.sum(1).clamp_min(1.0)


@torch.inference_mode()
def pooled_states(
    model: torch.nn.Module,
    encoded: Encoded,
    *,
    batch_size: int,
    device: torch.device,
    desc: str | None = None,
    shard: tuple[int, int] = WHOLE,
) -> np.ndarray:
    """Mean last-layer hidden states [N, H] in row order (for a shard, only its rows are filled)."""
    model.eval()
    out = np.zeros((len(encoded), model.config.hidden_size), dtype=np.float32)
    for batch in iterate(encoded, batch_size, device, desc, shard):
        inputs = model_inputs(batch)
        with autocast(device):
            hidden = model(**inputs, output_hidden_states=True).hidden_states[-1]
        out[batch["index"].cpu().numpy()] = masked_mean(hidden, inputs["attention_mask"]).cpu().numpy()
    return out


def compute(params: dict, teacher_dir: Path, data_dir: Path, shard: tuple[int, int], part: Path):
    """Write the shard's pooled states and row ids into the part folder; return (rows, manifest fields)."""
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"])
    teacher.model.to(device)
    pooled = pooled_states(
        teacher.model,
        teacher.encoded,
        batch_size=params["batch_size"],
        device=device,
        desc=f"pooled {params['split']}",
        shard=shard,
    )
    rows = shard_rows(pass_batches(teacher.encoded, params["batch_size"], shard))
    np.save(part / "pooled.npy", pooled[rows])
    meta = {"rows": len(teacher.encoded), "labels": teacher.labels, "hidden_size": pooled.shape[1]}
    return rows, {**meta, "teacher": teacher.teacher_config}


def write(params: dict, meta: dict, parts, out_dir: Path) -> dict:
    """``pooled.npy`` + ``pooled.json`` in ``out_dir`` from the parts of every shard (rows in the split's order,
    like the feature dumps)."""
    data_file, manifest_file = (out_dir / name for name in SIGNALS["pooled"].files)
    ensure_disk_space(data_file, 4 * meta["rows"] * meta["hidden_size"], "the pooled states", hint="free space")
    with atomic_path(data_file) as tmp:
        gather_array(parts, "pooled", meta["rows"], out=tmp)
    manifest = make_manifest("pooled", config=params, split=params["split"], **meta)
    return write_manifest(manifest_file, manifest, [data_file.name])
