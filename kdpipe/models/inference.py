"""Batched eval-mode forward passes over an encoded split, with results returned in the split's row order, and a
progress bar in rows (docs/design.md, "Compute")."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn

from kdpipe.core import progress
from kdpipe.core.device import autocast
from kdpipe.data.batching import WHOLE, Batches, Encoded, collate, inference_batches, model_inputs, shard_batches


def pass_batches(encoded: Encoded, batch_size: int, shard: tuple[int, int] = WHOLE) -> Batches:
    """The row-index batches of an inference pass, longest first; shard ``(k, S)``: every S-th from the k-th
    (:mod:`kdpipe.signals.shards`: S shards run exactly the batches of one unsharded pass)."""
    return shard_batches(inference_batches(encoded.lengths, batch_size), shard)


def iterate(
    encoded: Encoded, batch_size: int, device: torch.device, desc: str | None = None, shard: tuple[int, int] = WHOLE
) -> Iterator[dict]:
    """Collated batches, longest first, with a progress bar in rows (rows/s, time left) when ``desc`` is given."""
    batches = pass_batches(encoded, batch_size, shard)
    with progress.bar(len(batches.rows), desc) as bar:
        for index in batches:
            yield collate(encoded, index, device)
            bar.update(len(index))


@torch.inference_mode()
def _predict(
    model: nn.Module,
    encoded: Encoded,
    pick: Callable,
    *,
    batch_size: int,
    device: torch.device,
    desc: str | None,
    shard: tuple[int, int] = WHOLE,
) -> np.ndarray:
    """``pick(model output)`` -> tensor [..., B, C] for every batch, gathered into [..., N, C] in row order (for a
    shard, only its rows are filled)."""
    model.eval()
    out = None
    for batch in iterate(encoded, batch_size, device, desc, shard):
        with autocast(device):
            values = pick(model(**model_inputs(batch))).float().cpu().numpy()
        if out is None:
            out = np.zeros((*values.shape[:-2], len(encoded), values.shape[-1]), dtype=np.float32)
        out[..., batch["index"].cpu().numpy(), :] = values
    if out is None:  # a shard with no batch (more shards than batches)
        out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    return out


def predict_logits(
    model: nn.Module,
    encoded: Encoded,
    *,
    batch_size: int,
    device: torch.device,
    desc: str | None = None,
    shard: tuple[int, int] = WHOLE,
) -> np.ndarray:
    """Eval-mode logits [N, C] (float32) in row order (a multi-head model: log of its heads' mean probability)."""
    return _predict(
        model, encoded, lambda out: out.logits, batch_size=batch_size, device=device, desc=desc, shard=shard
    )


def predict_member_logits(
    model: nn.Module, encoded: Encoded, *, batch_size: int, device: torch.device, desc: str | None = None
) -> np.ndarray:
    """Eval-mode logits of each member [M, N, C]: the heads of a multi-head model (its ``head_logits``), else the
    one model (M = 1)."""

    def pick(out):
        heads = getattr(out, "head_logits", None)
        return heads if heads is not None else out.logits[None]

    return _predict(model, encoded, pick, batch_size=batch_size, device=device, desc=desc)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def probs_predictor(encoded: Encoded, *, batch_size: int, device: torch.device) -> Callable[[nn.Module], np.ndarray]:
    """A function model -> softmax probabilities on ``encoded`` (used as the validation pass in training)."""
    return lambda model: softmax(predict_logits(model, encoded, batch_size=batch_size, device=device))
