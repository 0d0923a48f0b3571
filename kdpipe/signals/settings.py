"""The typed settings of the teacher signal passes (docs/design.md, "Style": settings read once): one signal's slice
(what the ``signal-gather`` job reads, and every signal's manifest records) and a pass's, the slices of the signals
it makes (``signal-pass``, ``signal-shard``). Made by :meth:`kdpipe.plan.slices.Slices.signal_params`; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.core.settings import Settings


@dataclass(frozen=True)
class SignalSettings(Settings):
    """One signal of one teacher on one split: its name, the split, and the settings of its pass (the config
    section ``dump`` or ``mc_dropout``); a feature dump's ``layers``, MC-dropout's own keys."""

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
