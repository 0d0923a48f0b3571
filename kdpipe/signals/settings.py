"""The typed settings of the teacher signal passes (docs/design.md, "Style": settings read once): one signal's slice
(what the ``signal-gather`` job reads, and every signal's manifest records) and a pass's, the slices of the signals
it makes (``signal-pass``, ``signal-shard``). Made by :meth:`kdpipe.plan.slices.Slices.signal_params`; torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kdpipe.core.settings import Settings


@dataclass(frozen=True)
class SignalSettings(Settings):
    """One signal of one teacher on one split: its name, the split, and the settings of its pass (the config
    section ``dump`` or ``mc_dropout``: kdpipe.signals.catalog). A feature dump also has the ``layers`` the
    students need; MC-dropout its samples, seed and enlarged-batch bound, and ``dropout`` when the config sets
    one."""

    signal: str
    split: str
    batch_size: int
    layers: tuple[int, ...] | None = None
    samples: int | None = None
    seed: int | None = None
    max_batch_rows: int | None = None
    dropout: float | None = None


@dataclass(frozen=True)
class PassSettings(Settings):
    """A pass's slice: the slice of each signal it makes, in catalog order."""

    signals: tuple[SignalSettings, ...]


@dataclass(frozen=True)
class PromptSettings(Settings):
    """A prompted teacher's ``prompt`` section, checked and completed by
    :func:`kdpipe.signals.prompts.prompt_settings` (docs/methods.md §7): the model (a local folder, a GGUF file or a
    hub name), the templates, one or more verbalizer sets ``{class: [words]}``, the few-shot examples per class and
    their draws and seed, the content-free inputs of calibration (none: no calibration), whether the prompts go
    through the chat template (``auto``, true, false) and the tokens kept of a row's text."""

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
    settings. Made by :meth:`kdpipe.plan.prompted.Prompted.prompt_params`."""

    split: str
    batch_size: int
    classes: tuple[str, ...]
    prompt: PromptSettings
