"""Batched eval-mode forward passes over an encoded split, with results returned in the split's row order, and a
progress bar in rows (docs/design.md, "Compute")."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch
from scipy import special
from torch import nn

from kdpipe.core import progress
from kdpipe.core.device import autocast
from kdpipe.data.batching import WHOLE, Batches, Encoded, collate, inference_batches, model_inputs, shard_batches


def pass_batches(encoded: Encoded, batch_size: int, shard: tuple[int, int] = WHOLE) -> Batches:
    """The row-index batches of an inference pass, longest first; shard ``(k, S)``: every S-th from the k-th (S
    shards run exactly the batches of one unsharded pass)."""
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
def predict_logits(
    model: nn.Module,
    encoded: Encoded,
    *,
    batch_size: int,
    device: torch.device,
    desc: str | None = None,
    shard: tuple[int, int] = WHOLE,
    members: bool = False,
    dropout: bool = False,
) -> np.ndarray:
    """Logits in row order (float32; a shard fills its rows): [N, C] (a multi-head model: log of its heads' mean
    probability), or with ``members`` each member's [M, N, C] (a multi-head model's heads, else the one model, M = 1).
    In eval mode, but for dropout with ``dropout``."""
    if dropout:
        enable_dropout(model)
    else:
        model.eval()
    out = None
    for batch in iterate(encoded, batch_size, device, desc, shard):
        with autocast(device):
            output = model(**model_inputs(batch))
            logits = output.logits
            if members:
                heads = getattr(output, "head_logits", None)
                logits = logits[None] if heads is None else heads
            values = logits.float().cpu().numpy()
        if out is None:
            out = np.zeros((*values.shape[:-2], len(encoded), values.shape[-1]), dtype=np.float32)
        out[..., batch["index"].cpu().numpy(), :] = values
    if out is None:  # a shard with no batch (more shards than batches)
        out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    return out


def enable_dropout(model: nn.Module) -> nn.Module:
    """Eval mode except ``nn.Dropout`` and attention modules (whose attention dropout follows their flag)."""
    model.eval()
    for module in model.modules():
        if isinstance(module, nn.Dropout) or type(module).__name__.endswith("Attention"):
            module.train()
    return model


def dropout_rates(model: nn.Module) -> list[float]:
    """Every dropout probability of a model: its ``nn.Dropout`` modules' and float ``*dropout*`` attributes."""
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    return rates + [v for m in model.modules() for a, v in vars(m).items() if "dropout" in a and isinstance(v, float)]


def mc_member_logits(
    model: nn.Module,
    encoded: Encoded,
    *,
    samples: int,
    seed: int,
    batch_size: int,
    device: torch.device,
    desc: str | None = None,
) -> np.ndarray:
    """MC-dropout at evaluation (docs/methods.md, "Judging uncertainty"): the members' logits of ``samples``
    dropout-on passes, pass t seeded by ``(seed, t)``, as [T·M, N, C] (sample-major). A pass at a time: any model
    runs this way, and evaluation splits are small."""
    passes = []
    for t in range(samples):
        torch.manual_seed(seed * 1_000_003 + t)
        label = f"{desc} (MC-dropout {t + 1}/{samples})" if desc else None
        passes.append(
            predict_logits(model, encoded, batch_size=batch_size, device=device, desc=label, members=True, dropout=True)
        )
    model.eval()
    return np.concatenate(passes)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    return special.softmax(logits, axis=-1)


def probs_predictor(encoded: Encoded, *, batch_size: int, device: torch.device) -> Callable[[nn.Module], np.ndarray]:
    """A function model -> softmax probabilities on ``encoded`` (training's validation pass)."""
    return lambda model: softmax(predict_logits(model, encoded, batch_size=batch_size, device=device))
