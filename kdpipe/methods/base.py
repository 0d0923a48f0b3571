"""What a method receives (:class:`DistillContext`) and returns (:class:`Objective`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from kdpipe.batching import model_inputs


@dataclass
class DistillContext:
    """Everything a method may read: cached teacher signals on the train split, never a teacher model.

    ``signals[teacher][name]``: e.g. ``"logits"`` (tensor [N, C_k] on the device, row order of the train split),
    ``"mc"`` (tensor [N, C_k] mean MC-dropout probabilities), ``"certainty"`` (tensor [N], MUKI's u) and
    ``"mc_scores"`` (DataFrame); ``"hidden"`` (float16 memmap [N, L_sel, S, H]) with ``"hidden_layers"``.
    ``blocks[teacher]``: student-label index of each of the teacher's local classes.
    """

    labels: list[str]
    teachers: list[str]
    blocks: dict[str, np.ndarray]
    signals: dict[str, dict]
    device: torch.device
    student_config: object = None
    train_lengths: np.ndarray | None = None        # student token count per train row
    alignment: dict | None = None                  # teacher -> [[student_layer, teacher_layer], ...]

    def signal(self, teacher: str, name: str):
        return self.signals[teacher][name]

    def block(self, teacher: str) -> torch.Tensor:
        return torch.as_tensor(self.blocks[teacher], device=self.device)


@dataclass
class Objective:
    """``loss(model, batch) -> (loss, terms)``; ``extra_modules``: ``{name: (module, lr)}`` trained alongside;
    ``on_epoch(epoch, epochs)``: called by the training loop before each epoch (0-based), for epoch schedules."""

    loss: Callable
    extra_modules: dict[str, tuple[nn.Module, float]] = field(default_factory=dict)
    on_epoch: Callable[[int, int], None] | None = None


def student_logits(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**model_inputs(batch)).logits
