"""What the shared training loop optimises: an :class:`Objective` (a teacher's loss or a distillation method's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn


@dataclass
class Objective:
    """``loss(model, batch) -> (loss, terms)``; ``extra_modules``: ``{name: (module, lr)}`` trained alongside;
    ``on_epoch(epoch, epochs)``: called by the training loop before each epoch (0-based), for epoch schedules;
    ``extra_state``: training state the loss keeps across steps (``state_dict`` / ``load_state_dict``), checkpointed
    with the student (ProKT's co-trained teacher); ``save(folder, fit_result)``: writes what the objective trained
    besides the model into the model's output folder (the meta-teacher's domain branch); ``validates``: False when
    validation accuracy cannot choose the best epoch (Meta-KD's first stage trains no classifier: the last epoch
    is kept)."""

    loss: Callable
    extra_modules: dict[str, tuple[nn.Module, float]] = field(default_factory=dict)
    on_epoch: Callable[[int, int], None] | None = None
    extra_state: object | None = None
    save: Callable | None = None
    validates: bool = True
