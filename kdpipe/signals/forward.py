"""The teacher's one eval-mode forward pass over a split (or a shard of it) that makes every deterministic signal
the config needs of that teacher on that split: logits, pooled states, hidden states, attentions, Meta-KD's domain
signals (docs/design.md, "Signals").

Each signal's module gives a ``collector(settings, teacher, rows, part, device)`` whose ``add(batch, outputs)``
fills the signal's part folder and whose ``finish()`` returns the manifest fields. Signals that need eager attention
get a second forward, so the others keep the bytes they have when made alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from kdpipe.core.device import autocast, pick_device
from kdpipe.data.batching import WHOLE, Encoded, model_inputs
from kdpipe.models.inference import iterate, pass_batches
from kdpipe.signals.catalog import signal_spec
from kdpipe.signals.parts import finish_part, shard_rows
from kdpipe.signals.settings import SignalSettings
from kdpipe.signals.teacher import open_teacher


@torch.inference_mode()
def forward(
    model: torch.nn.Module,
    encoded: Encoded,
    collectors: Iterable,
    *,
    batch_size: int,
    device: torch.device,
    desc: str | None = None,
    shard: tuple[int, int] = WHOLE,
) -> None:
    """Run ``model`` in eval mode over the shard's batches, every batch's outputs to each collector, outside the
    autocast region (a collector that computes more enters it itself)."""
    collectors = list(collectors)
    hidden = any(c.hidden_states for c in collectors)
    attentions = any(c.attentions for c in collectors)
    model.eval()
    for batch in iterate(encoded, batch_size, device, desc, shard):
        with autocast(device):
            outputs = model(**model_inputs(batch), output_hidden_states=hidden, output_attentions=attentions)
        for collector in collectors:
            collector.add(batch, outputs)


def compute(
    signals: Sequence[SignalSettings], teacher_dir: Path, data_dir: Path, shard: tuple[int, int], part: Path
) -> None:
    """The shard's part of every signal in ``signals`` (of one split and ``dump.batch_size``, as the plan groups
    them), each into ``part/<signal>``."""
    split, batch_size = signals[0].split, signals[0].batch_size
    device = pick_device()
    for attention in sorted({signal_spec(s.signal).attention for s in signals}, key=str):
        group = [s for s in signals if signal_spec(s.signal).attention == attention]
        teacher = open_teacher(teacher_dir, data_dir, split, attn=attention)
        teacher.model.to(device)
        rows = shard_rows(pass_batches(teacher.encoded, batch_size, shard))
        folders = [Path(part) / s.signal for s in group]
        collectors = []
        for settings, folder in zip(group, folders):
            folder.mkdir(parents=True, exist_ok=True)
            module = importlib.import_module(signal_spec(settings.signal).module)
            collectors.append(module.collector(settings, teacher, rows, folder, device))
        desc = f"{', '.join(s.signal for s in group)} {split}"
        forward(
            teacher.model, teacher.encoded, collectors, batch_size=batch_size, device=device, desc=desc, shard=shard
        )
        for collector, folder in zip(collectors, folders):
            finish_part(folder, rows, collector.finish())
        del teacher, collectors
