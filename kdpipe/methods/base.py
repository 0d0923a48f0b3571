"""What a method receives (:class:`DistillContext`) and returns (:class:`Objective`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
from torch import nn

from kdpipe.batching import model_inputs
from kdpipe.store import KdpipeError


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

    def check_token_aligned(self, method: str) -> None:
        """Token-level hidden states are only comparable when the student tokenised the train split exactly as
        the teachers' dumps did (same tokenizer and max_length)."""
        for t in self.teachers:
            if not np.array_equal(np.asarray(self.signal(t, "hidden_lengths")), self.train_lengths):
                raise KdpipeError(f"{method}: teacher '{t}' hidden states were dumped with another tokenisation "
                                  f"than the student's; {method} compares tokens, so give the student the "
                                  "teacher's tokenizer and max_length")

    def hidden_slot(self, teacher: str, layer: int) -> int:
        """Position of teacher hidden-state index ``layer`` in the dump (which keeps only the planned layers)."""
        return self.signal(teacher, "hidden_layers").index(layer)

    def teacher_hidden(self, teacher: str, slot: int, index: np.ndarray, width: int) -> torch.Tensor:
        """Cached hidden states [B, width, H] (float32, on the device) of dump slot ``slot`` for train rows
        ``index``, cut to the batch's padded width."""
        rows = np.asarray(self.signal(teacher, "hidden")[index, slot, :width], dtype=np.float32)
        return torch.from_numpy(rows).to(self.device, non_blocking=True)


@dataclass
class Objective:
    """``loss(model, batch) -> (loss, terms)``; ``extra_modules``: ``{name: (module, lr)}`` trained alongside;
    ``on_epoch(epoch, epochs)``: called by the training loop before each epoch (0-based), for epoch schedules;
    ``extra_state``: training state the loss keeps across steps (``state_dict`` / ``load_state_dict``), checkpointed
    with the student (ProKT's co-trained teacher)."""

    loss: Callable
    extra_modules: dict[str, tuple[nn.Module, float]] = field(default_factory=dict)
    on_epoch: Callable[[int, int], None] | None = None
    extra_state: object | None = None


def student_logits(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**model_inputs(batch)).logits
