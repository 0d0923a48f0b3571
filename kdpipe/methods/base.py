"""What a method receives (:class:`DistillContext`) and returns (:class:`Objective`, shared with teacher
objectives: :mod:`kdpipe.training.loop`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import model_inputs
from kdpipe.training.loop import Objective

__all__ = ["DistillContext", "Objective", "student_logits"]


@dataclass
class DistillContext:
    """Everything a method may read: cached teacher signals on the train split, never a teacher model
    (docs/adding-a-method.md). ``signals[teacher][name]``: e.g. ``"logits"`` (tensor [N, C_k] on the device, in
    the student's train row order); the token-level dumps are read through :meth:`teacher_feature`.
    ``blocks[teacher]``: the student-label index of each of the teacher's local classes."""

    labels: list[str]
    teachers: list[str]
    blocks: dict[str, np.ndarray]
    signals: dict[str, dict]
    device: torch.device
    student_config: object = None
    train_lengths: np.ndarray | None = None  # student token count per train row
    train_tokens: np.ndarray | None = None  # student token-id hash per train row (Encoded.token_hashes)
    alignment: dict | None = None  # teacher -> [[student_layer, teacher_layer], ...]
    domains: list[str] | None = None
    domain_ids: torch.Tensor | None = None  # Meta-KD: each train row's index into ``domains``
    prototype_scores: torch.Tensor | None = None  # Meta-KD: each train row's prototype score
    train_labels: np.ndarray | None = None  # gold label index per train row (for diagnostics only)
    # the student's route (docs/routing.md): "scores" [N, K] (teachers in ``teachers`` order), "weighting" and
    # "temperatures" (when calibrated)
    route: dict | None = None

    def signal(self, teacher: str, name: str):
        return self.signals[teacher][name]

    def block(self, teacher: str) -> torch.Tensor:
        return torch.as_tensor(self.blocks[teacher], device=self.device)

    def full_label_logits(self, teacher: str) -> torch.Tensor:
        """The cached train logits [N, C] of a teacher that covers every label, in the student's label order."""
        return self.signal(teacher, "logits")[:, torch.argsort(self.block(teacher))]

    def check_token_aligned(self, method: str, feature: str = "hidden") -> None:
        """Refuse token-level features of a dump tokenised otherwise than the student's train split."""
        for t in self.teachers:
            dump = self.signal(t, feature)
            same = (
                np.array_equal(dump.token_hashes, self.train_tokens)
                if dump.token_hashes is not None and self.train_tokens is not None
                else np.array_equal(dump.lengths, self.train_lengths)
            )
            if not same:
                raise KdpipeError(
                    f"{method}: teacher '{t}' {feature} were dumped with another tokenisation "
                    f"than the student's; {method} compares tokens, so give the student the "
                    "teacher's tokenizer and max_length"
                )

    def hidden_slot(self, teacher: str, layer: int, feature: str = "hidden") -> int:
        """Position of teacher layer ``layer`` in a feature dump (which keeps only the planned layers)."""
        return self.signal(teacher, feature).layers.index(layer)

    def teacher_feature(self, teacher: str, feature: str, slot: int, index: np.ndarray, width: int) -> torch.Tensor:
        """Cached token-level features of dump slot ``slot`` for train rows ``index`` (float32, on the device),
        zero-padded to the batch's width: hidden states [B, width, H], attentions [B, (heads,) width, width]; the one
        access point to a dump stored without padding (docs/design.md, "Feature dumps and their size")."""
        return self.signal(teacher, feature).batch(index, slot, width, self.device)


def student_logits(model: nn.Module, batch: dict) -> torch.Tensor:
    return model(**model_inputs(batch)).logits
