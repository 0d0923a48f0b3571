"""Batched eval-mode forward passes over an encoded split, with results returned in the split's row order."""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch
from torch import nn
from tqdm.auto import tqdm

from kdpipe.batching import Encoded, collate, inference_batches, model_inputs
from kdpipe.device import autocast


def iterate(encoded: Encoded, batch_size: int, device: torch.device, desc: str | None = None) -> Iterator[dict]:
    """Collated batches, longest first, with a progress bar when ``desc`` is given."""
    batches = inference_batches(encoded.lengths, batch_size)
    for index in tqdm(batches, desc=desc, disable=desc is None, mininterval=5, dynamic_ncols=True):
        yield collate(encoded, index, device)


@torch.inference_mode()
def predict_logits(model: nn.Module, encoded: Encoded, *, batch_size: int, device: torch.device,
                   desc: str | None = None) -> np.ndarray:
    """Eval-mode logits [N, C] (float32) in row order."""
    model.eval()
    out = np.zeros((len(encoded), model.config.num_labels), dtype=np.float32)
    for batch in iterate(encoded, batch_size, device, desc):
        with autocast(device):
            logits = model(**model_inputs(batch)).logits
        out[batch["index"].cpu().numpy()] = logits.float().cpu().numpy()
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def probs_predictor(encoded: Encoded, *, batch_size: int, device: torch.device) -> Callable[[nn.Module], np.ndarray]:
    """A function model -> softmax probabilities on ``encoded`` (used as the validation pass in training)."""
    return lambda model: softmax(predict_logits(model, encoded, batch_size=batch_size, device=device))
