"""The ``dump_teacher`` stage: eval-mode teacher signals of one split, for distillation from the cache.

- ``logits.parquet``: eval-mode logits (row_id, logits), always.
- ``hidden.npy``: hidden states of the chosen layers (0 = embeddings), float16 [N, L_sel, max_length, H],
  zero-padded past each row's length;
- ``attentions.npy``: post-softmax attention probabilities of the chosen layers (1-based, as layer l's output),
  float16 [N, L_sel, heads, max_length, max_length].

Dense arrays are written incrementally through ``numpy.lib.format.open_memmap``, so memory stays flat in N.
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
from kdpipe.inference import iterate, predict_logits
from kdpipe.signals import manifest_path, write_logits
from kdpipe.store import ArtifactError, atomic_path, make_manifest, write_json
from kdpipe.teacher_inputs import open_teacher

FEATURES = ("hidden", "attentions")


def feature_shape(config, feature: str, n: int, layers: list[int], max_length: int) -> tuple[int, ...]:
    if feature == "hidden":
        return (n, len(layers), max_length, config.hidden_size)
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
    return torch.stack(pick, 1)


@torch.inference_mode()
def dump_feature(model, encoded, feature: str, layers: list[int], out_npy: Path, *, batch_size: int,
                 device: torch.device, max_length: int) -> None:
    n = len(encoded)
    array = open_memmap(out_npy, mode="w+", dtype=np.float16,
                        shape=feature_shape(model.config, feature, n, layers, max_length))
    model.eval()
    for batch in iterate(encoded, batch_size, device, desc=f"dump {feature}"):
        with autocast(device):
            outputs = model(**model_inputs(batch), output_hidden_states=feature == "hidden",
                            output_attentions=feature == "attentions")
        values = _selected(outputs, feature, layers)
        # zero every position past a row's own length, so the dump does not depend on its batch's padding
        mask = batch["attention_mask"].to(values.dtype)
        if feature == "hidden":
            values = values * mask[:, None, :, None]
        else:
            values = values * mask[:, None, None, :, None] * mask[:, None, None, None, :]
        values = values.to(torch.float16).cpu().numpy()
        width = values.shape[-2]
        rows = batch["index"].cpu().numpy()
        if feature == "hidden":
            array[rows, :, :width] = values
        else:
            array[rows, :, :, :width, :width] = values
    array.flush()


def run(params: dict, teacher_dir: Path, data_dir: Path, out_logits: Path) -> dict:
    """Write ``logits.parquet`` + ``logits.json`` for one teacher and split."""
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"])
    teacher.model.to(device)
    logits = predict_logits(teacher.model, teacher.encoded, batch_size=params["batch_size"], device=device,
                            desc=f"logits {params['split']}")
    with atomic_path(out_logits) as tmp:
        write_logits(tmp, teacher.encoded.row_ids, logits)
    manifest = make_manifest("logits", config=params, split=params["split"], rows=len(logits),
                             labels=teacher.labels, teacher=teacher.teacher_config)
    write_json(manifest_path(out_logits), manifest)
    return manifest


def run_feature(params: dict, teacher_dir: Path, data_dir: Path, out_npy: Path) -> dict:
    """Write ``{hidden,attentions}.npy`` + its manifest for the layers in ``params['layers']``."""
    feature, layers = params["feature"], list(params["layers"])
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"],
                           attn="eager" if feature == "attentions" else None)
    teacher.model.to(device)
    max_length = int(teacher.encoded.lengths.max())
    with atomic_path(out_npy) as tmp:
        dump_feature(teacher.model, teacher.encoded, feature, layers, tmp, batch_size=params["batch_size"],
                     device=device, max_length=max_length)
    manifest = make_manifest(feature, config=params, split=params["split"], rows=len(teacher.encoded),
                             labels=teacher.labels, layers=layers, lengths=teacher.encoded.lengths.tolist(),
                             bytes_per_example=bytes_per_example(teacher.model.config, feature, layers, max_length))
    write_json(manifest_path(out_npy), manifest)
    return manifest
