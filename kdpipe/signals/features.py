"""The feature signals: token-level teacher states of one split, for methods that align with them.

- ``hidden.npy``: hidden states of the chosen layers (0 = embeddings), float16 [N, L_sel, S, H],
  zero-padded past each row's length;
- ``attentions.npy``: post-softmax attention probabilities of the chosen layers (1-based, as layer l's output),
  float16 [N, L_sel, heads, S, S];
- ``attentions_mean.npy``: the same averaged over the heads, [N, L_sel, S, S] (for a student
  with another head count; ``heads`` times smaller).

Post-softmax probabilities, as EasyNLP's Hugging Face models return them (the original TinyBERT-based Meta-KD code
matched pre-softmax scores, which transformers does not expose without patching its attention modules); rows and
columns past a row's length are zero. Bytes per example: hidden 2·L_sel·S·H, attentions 2·L_sel·heads·S²,
attentions_mean 2·L_sel·S² (S: the split's longest tokenised row). Dense arrays are written a batch of rows at a time
with plain file writes (:mod:`kdpipe.signals.rowfile`), so memory stays flat in N, after a check that the disk has
room for them.
A large split runs as S shards gathered into the same bytes (:mod:`kdpipe.signals.shards`).
Attentions need ``attn_implementation="eager"``: under the default SDPA implementation transformers returns an
empty tuple without error, so the shapes are checked here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast, pick_device
from kdpipe.core.store import ArtifactError, atomic_path, ensure_disk_space, make_manifest
from kdpipe.data.batching import WHOLE, model_inputs
from kdpipe.models.inference import iterate, pass_batches
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.rowfile import RowFile
from kdpipe.signals.shards import gather_array, shard_rows
from kdpipe.signals.teacher import open_teacher


def feature_shape(config, feature: str, n: int, layers: list[int], max_length: int) -> tuple[int, ...]:
    if feature == "hidden":
        return (n, len(layers), max_length, config.hidden_size)
    if feature == "attentions_mean":
        return (n, len(layers), max_length, max_length)
    return (n, len(layers), config.num_attention_heads, max_length, max_length)


def bytes_per_example(config, feature: str, layers: list[int], max_length: int) -> int:
    """float16 bytes one example takes in a feature dump (for docs and the disk check)."""
    return 2 * int(np.prod(feature_shape(config, feature, 1, layers, max_length)))


def _selected(outputs, feature: str, layers: list[int]) -> torch.Tensor:
    states = outputs.hidden_states if feature == "hidden" else outputs.attentions
    needed = max(layers) + 1 if feature == "hidden" else max(layers)
    if not states or len(states) < needed:
        raise ArtifactError(
            f"the model returned {len(states or ())} {feature} tensors, {needed} needed "
            "(attentions need attn_implementation='eager')"
        )
    pick = [states[l] if feature == "hidden" else states[l - 1] for l in layers]
    stacked = torch.stack(pick, 1)
    return stacked.float().mean(2) if feature == "attentions_mean" else stacked


@torch.inference_mode()
def dump_feature(
    model,
    encoded,
    feature: str,
    layers: list[int],
    out_npy: Path,
    *,
    batch_size: int,
    device: torch.device,
    max_length: int,
    shard: tuple[int, int] = WHOLE,
) -> np.ndarray:
    """Write the feature of the shard's rows (all rows by default), in split order, to ``out_npy``; returns those
    row positions."""
    rows = shard_rows(pass_batches(encoded, batch_size, shard))
    position = np.full(len(encoded), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    shape = feature_shape(model.config, feature, len(rows), layers, max_length)
    ensure_disk_space(
        out_npy,
        2 * int(np.prod(shape)),
        f"the {feature} dump ({len(rows)} rows x "
        f"{bytes_per_example(model.config, feature, layers, max_length):,} bytes)",
    )
    array = RowFile.create(out_npy, shape, np.float16)
    model.eval()
    for batch in iterate(encoded, batch_size, device, desc=f"dump {feature}", shard=shard):
        with autocast(device):
            outputs = model(
                **model_inputs(batch), output_hidden_states=feature == "hidden", output_attentions=feature != "hidden"
            )
        values = _selected(outputs, feature, layers)
        # zero every position past a row's own length, so the dump does not depend on its batch's padding
        mask = batch["attention_mask"].to(values.dtype)
        if feature == "hidden":
            values = values * mask[:, None, :, None]
        else:  # [B, L, (heads,) S, S]: zero rows and columns past the length
            square = mask[:, :, None] * mask[:, None, :]
            values = values * square.view(square.shape[0], 1, *(1,) * (values.dim() - 4), *square.shape[1:])
        values = values.to(torch.float16).cpu().numpy()
        # whole rows, zero past the batch's width (the dump's width is the split's longest row)
        pad = max_length - values.shape[-2]
        widths = [(0, 0)] * (values.ndim - 2) + ([(0, pad), (0, 0)] if feature == "hidden" else [(0, pad), (0, pad)])
        array.write(position[batch["index"].cpu().numpy()], np.pad(values, widths))
    array.close()
    return rows


def compute(params: dict, teacher_dir: Path, data_dir: Path, shard: tuple[int, int], part: Path):
    """Dump the shard's rows of ``params["signal"]`` straight into the part folder (memory flat in N); return
    (rows, manifest fields)."""
    feature, layers = params["signal"], list(params["layers"])
    device = pick_device()
    teacher = open_teacher(
        teacher_dir, data_dir, params["split"], attn="eager" if feature.startswith("attentions") else None
    )
    teacher.model.to(device)
    max_length = int(teacher.encoded.lengths.max())
    rows = dump_feature(
        teacher.model,
        teacher.encoded,
        feature,
        layers,
        part / f"{feature}.npy",
        batch_size=params["batch_size"],
        device=device,
        max_length=max_length,
        shard=shard,
    )
    meta = {
        "rows": len(teacher.encoded),
        "labels": teacher.labels,
        "layers": layers,
        "lengths": teacher.encoded.lengths.tolist(),
        "token_hashes": teacher.encoded.token_hashes.tolist(),  # students check they tokenise the same way
        "bytes_per_example": bytes_per_example(teacher.model.config, feature, layers, max_length),
    }
    return rows, meta


def write(params: dict, meta: dict, parts, out_dir: Path) -> dict:
    """``<feature>.npy`` + its manifest in ``out_dir`` from the parts of every shard (memory flat in N)."""
    feature = params["signal"]
    data_file, manifest_file = (out_dir / name for name in SIGNALS[feature].files)
    ensure_disk_space(
        data_file,
        meta["rows"] * meta["bytes_per_example"],
        f"the gathered {feature} dump ({meta['rows']} rows x {meta['bytes_per_example']:,} bytes)",
    )
    with atomic_path(data_file) as tmp:
        gather_array(parts, feature, meta["rows"], out=tmp)
    manifest = make_manifest(feature, config=params, split=params["split"], **meta)
    return write_manifest(manifest_file, manifest, [data_file.name])
