"""What the shared training loop optimises: an :class:`Objective` (a teacher's loss or a distillation method's)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn


@dataclass
class Objective:
    """``loss(model, batch) -> (loss, terms)``; ``extra_modules``: ``{name: (module, lr)}`` trained alongside;
    ``on_epoch(epoch, epochs)``: called before each epoch (0-based); ``extra_state``: state the loss keeps across
    steps (``state_dict`` / ``load_state_dict``), checkpointed; ``save(folder, fit_result)``: writes what else it
    trained into the model's folder; ``validates``: False to keep the last epoch instead of the best."""

    loss: Callable
    extra_modules: dict[str, tuple[nn.Module, float]] = field(default_factory=dict)
    on_epoch: Callable[[int, int], None] | None = None
    extra_state: object | None = None
    save: Callable | None = None
    validates: bool = True
