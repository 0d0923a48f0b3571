"""The typed settings of a prompted teacher's passes (docs/design.md, "Style": settings read once; docs/methods.md
§7): its ``prompt`` section and a pass's slice, made by :meth:`kdpipe.plan.prompted.Prompted.prompt_params`.
Torch-free. A module of their own, beside :mod:`kdpipe.signals.settings`, so that adding them changed no other
signal job's code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kdpipe.core.settings import Settings


@dataclass(frozen=True)
class PromptSettings(Settings):
    """A prompted teacher's ``prompt`` section, checked and completed by
    :func:`kdpipe.signals.prompts.prompt_settings`: the model (a local folder, a GGUF file or a hub name), the
    templates, one or more verbalizer sets ``{class: [words]}``, the few-shot examples per class and their draws and
    seed, the content-free inputs of calibration (none: no calibration), whether the prompts go through the chat
    template (``auto``, true, false) and the tokens kept of a row's text."""

    model: str
    templates: tuple[str, ...]
    verbalizers: tuple[Mapping[str, tuple[str, ...]], ...]
    shots: int
    shot_draws: int
    seed: int
    calibrate: tuple[str, ...]
    chat: bool | str
    max_length: int


@dataclass(frozen=True)
class PromptPassSettings(Settings):
    """A prompted teacher's pass over one split (``prompt-pass``, ``prompt-shard``, ``prompt-gather``): the split, the
    rows per batch (the teacher's ``eval_batch_size``), the teacher's classes in the dataset's order and its prompt
    settings."""

    split: str
    batch_size: int
    classes: tuple[str, ...]
    prompt: PromptSettings
