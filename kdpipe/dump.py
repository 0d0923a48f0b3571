"""The ``dump_teacher`` stage: eval-mode teacher signals of one split, for distillation from the cache.

- ``logits.parquet``: eval-mode logits (row_id, logits), always.
- ``hidden.npy``: hidden states of the chosen layers (0 = embeddings), float16 [N, L_sel, max_length, H],
  zero-padded past each row's length;
- ``attentions.npy``: post-softmax attention probabilities of the chosen layers (1-based, as layer l's output),
  float16 [N, L_sel, heads, max_length, max_length];
- ``attentions_mean.npy``: the same averaged over the heads, [N, L_sel, max_length, max_length] (for a student
  with another head count; ``heads`` times smaller).

Post-softmax probabilities, as EasyNLP's Hugging Face models return them (the original TinyBERT-based Meta-KD code
matched pre-softmax scores, which transformers does not expose without patching its attention modules); rows and
columns past a row's length are zero. Bytes per example: hidden 2·L_sel·S·H, attentions 2·L_sel·heads·S²,
attentions_mean 2·L_sel·S² (S: the split's longest tokenised row). Dense arrays are written incrementally through
``numpy.lib.format.open_memmap``, so memory stays flat in N, after a check that the disk has room for them (a memmap
on a full disk would fail half-way through with SIGBUS).
A large split runs as S shards (``*_shard`` then ``gather_*``; ``kdpipe.shards``) with the same bytes.
Attentions need ``attn_implementation="eager"``: under the default SDPA implementation transformers returns an
empty tuple without error, so the shapes are checked here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from numpy.lib.format import open_memmap

from kdpipe.batching import model_inputs
from kdpipe.device import autocast, pick_device
from kdpipe.inference import iterate, pass_batches, predict_logits
from kdpipe.shards import WHOLE, finish_part, gather_array, parse_shard, read_parts, shard_rows, write_part
from kdpipe.signals import manifest_path, write_logits
from kdpipe.store import ArtifactError, atomic_path, ensure_disk_space, make_manifest, write_json
from kdpipe.teacher_inputs import open_teacher

FEATURES = ("hidden", "attentions", "attentions_mean")


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
        raise ArtifactError(f"the model returned {len(states or ())} {feature} tensors, {needed} needed "
                            "(attentions need attn_implementation='eager')")
    pick = [states[l] if feature == "hidden" else states[l - 1] for l in layers]
    stacked = torch.stack(pick, 1)
    return stacked.float().mean(2) if feature == "attentions_mean" else stacked


@torch.inference_mode()
def dump_feature(model, encoded, feature: str, layers: list[int], out_npy: Path, *, batch_size: int,
                 device: torch.device, max_length: int, shard: tuple[int, int] = WHOLE) -> np.ndarray:
    """Write the feature of the shard's rows (all rows by default), in split order, to ``out_npy``; returns those
    row positions."""
    rows = shard_rows(pass_batches(encoded, batch_size, shard))
    position = np.full(len(encoded), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    shape = feature_shape(model.config, feature, len(rows), layers, max_length)
    ensure_disk_space(out_npy, 2 * int(np.prod(shape)), f"the {feature} dump ({len(rows)} rows x "
                      f"{bytes_per_example(model.config, feature, layers, max_length):,} bytes)")
    array = open_memmap(out_npy, mode="w+", dtype=np.float16, shape=shape)
    model.eval()
    for batch in iterate(encoded, batch_size, device, desc=f"dump {feature}", shard=shard):
        with autocast(device):
            outputs = model(**model_inputs(batch), output_hidden_states=feature == "hidden",
                            output_attentions=feature != "hidden")
        values = _selected(outputs, feature, layers)
        # zero every position past a row's own length, so the dump does not depend on its batch's padding
        mask = batch["attention_mask"].to(values.dtype)
        if feature == "hidden":
            values = values * mask[:, None, :, None]
        else:                                       # [B, L, (heads,) S, S]: zero rows and columns past the length
            square = mask[:, :, None] * mask[:, None, :]
            values = values * square.view(square.shape[0], 1, *(1,) * (values.dim() - 4), *square.shape[1:])
        values = values.to(torch.float16).cpu().numpy()
        width = values.shape[-2]
        local = position[batch["index"].cpu().numpy()]
        if feature == "hidden":
            array[local, :, :width] = values
        else:
            array[local, ..., :width, :width] = values
    array.flush()
    return rows


# ---- logits ----------------------------------------------------------------------------------------------------


def _logits(params: dict, teacher_dir: Path, data_dir: Path, shard: tuple[int, int]):
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"])
    teacher.model.to(device)
    logits = predict_logits(teacher.model, teacher.encoded, batch_size=params["batch_size"], device=device,
                            desc=f"logits {params['split']}", shard=shard)
    rows = shard_rows(pass_batches(teacher.encoded, params["batch_size"], shard))
    meta = {"rows": len(teacher.encoded), "labels": teacher.labels, "teacher": teacher.teacher_config}
    return rows, {"row_id": teacher.encoded.row_ids[rows], "logits": logits[rows]}, meta


def _write_logits(params: dict, meta: dict, row_ids: np.ndarray, logits: np.ndarray, out_logits: Path) -> dict:
    with atomic_path(out_logits) as tmp:
        write_logits(tmp, row_ids, logits)
    manifest = make_manifest("logits", config=params, split=params["split"], rows=meta["rows"],
                             labels=meta["labels"], teacher=meta["teacher"])
    write_json(manifest_path(out_logits), manifest)
    return manifest


def run(params: dict, teacher_dir: Path, data_dir: Path, out_logits: Path) -> dict:
    """Write ``logits.parquet`` + ``logits.json`` for one teacher and split (unsharded)."""
    _, arrays, meta = _logits(params, teacher_dir, data_dir, WHOLE)
    return _write_logits(params, meta, arrays["row_id"], arrays["logits"], out_logits)


def run_shard(params: dict, teacher_dir: Path, data_dir: Path, shard: str, out_part: Path) -> None:
    """One shard (``"k-of-S"``) of the logits pass, as a part folder."""
    rows, arrays, meta = _logits(params, teacher_dir, data_dir, parse_shard(shard))
    write_part(out_part, rows, arrays, meta)


def gather(params: dict, parts: list[Path], out_logits: Path) -> dict:
    """The artifacts of :func:`run`, byte for byte, from the parts of all shards."""
    meta, located = read_parts(parts)
    return _write_logits(params, meta, gather_array(located, "row_id", meta["rows"]),
                         gather_array(located, "logits", meta["rows"]), out_logits)


# ---- hidden states / attentions --------------------------------------------------------------------------------


def _feature(params: dict, teacher_dir: Path, data_dir: Path, out_npy: Path, shard: tuple[int, int]):
    """Dump the shard's rows of the feature into ``out_npy``; returns (rows, manifest fields)."""
    feature, layers = params["feature"], list(params["layers"])
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"],
                           attn="eager" if feature.startswith("attentions") else None)
    teacher.model.to(device)
    max_length = int(teacher.encoded.lengths.max())
    rows = dump_feature(teacher.model, teacher.encoded, feature, layers, out_npy, batch_size=params["batch_size"],
                        device=device, max_length=max_length, shard=shard)
    meta = {"rows": len(teacher.encoded), "labels": teacher.labels, "layers": layers,
            "lengths": teacher.encoded.lengths.tolist(),
            "bytes_per_example": bytes_per_example(teacher.model.config, feature, layers, max_length)}
    return rows, meta


def _feature_manifest(params: dict, meta: dict, out_npy: Path) -> dict:
    manifest = make_manifest(params["feature"], config=params, split=params["split"], **meta)
    write_json(manifest_path(out_npy), manifest)
    return manifest


def run_feature(params: dict, teacher_dir: Path, data_dir: Path, out_npy: Path) -> dict:
    """Write ``{hidden,attentions}.npy`` + its manifest for the layers in ``params['layers']`` (unsharded)."""
    with atomic_path(out_npy) as tmp:
        _, meta = _feature(params, teacher_dir, data_dir, tmp, WHOLE)
    return _feature_manifest(params, meta, out_npy)


def run_feature_shard(params: dict, teacher_dir: Path, data_dir: Path, shard: str, out_part: Path) -> None:
    """One shard of a feature dump, as a part folder (the feature written straight into it, memory flat)."""
    with atomic_path(out_part, directory=True) as tmp:
        rows, meta = _feature(params, teacher_dir, data_dir, tmp / f"{params['feature']}.npy", parse_shard(shard))
        finish_part(tmp, rows, meta)


def gather_feature(params: dict, parts: list[Path], out_npy: Path) -> dict:
    """The artifacts of :func:`run_feature`, byte for byte, from the parts of all shards (memory flat in N)."""
    meta, located = read_parts(parts)
    ensure_disk_space(out_npy, meta["rows"] * meta["bytes_per_example"],
                      f"the gathered {params['feature']} dump ({meta['rows']} rows x {meta['bytes_per_example']:,} bytes)")
    with atomic_path(out_npy) as tmp:
        gather_array(located, params["feature"], meta["rows"], out=tmp)
    return _feature_manifest(params, meta, out_npy)
