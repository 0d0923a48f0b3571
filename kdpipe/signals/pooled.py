"""The ``pooled`` signal: each row's mean last-layer hidden state under a teacher, float32 [N, H].

The small feature the feature-space routers read (docs/routing.md, "Routers"): the mean over the row's own tokens
of the teacher's last hidden layer, made by the teacher's shared forward pass (:mod:`kdpipe.signals.forward`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import atomic_path, ensure_disk_space, make_manifest
from kdpipe.data.batching import model_inputs
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.parts import gather_array
from kdpipe.signals.settings import SignalSettings
from kdpipe.signals.teacher import TeacherPass


class PooledCollector:
    """The pooled last-layer states of the shard's rows into the part folder."""

    hidden_states, attentions = True, False

    def __init__(self, settings: SignalSettings, teacher: TeacherPass, rows: np.ndarray, part: Path, device) -> None:
        self.teacher, self.rows, self.part = teacher, rows, part
        self.pooled = np.zeros((len(teacher.encoded), teacher.model.config.hidden_size), dtype=np.float32)

    def add(self, batch: dict, outputs) -> None:
        weights = model_inputs(batch)["attention_mask"].to(torch.float32).unsqueeze(-1)  # the mean over real tokens
        pooled = (outputs.hidden_states[-1].float() * weights).sum(1) / weights.sum(1).clamp_min(1.0)
        self.pooled[batch["index"].cpu().numpy()] = pooled.cpu().numpy()

    def finish(self) -> dict:
        np.save(self.part / "pooled.npy", self.pooled[self.rows])
        teacher = self.teacher
        meta = {"rows": len(teacher.encoded), "labels": teacher.labels, "hidden_size": self.pooled.shape[1]}
        return {**meta, "teacher": teacher.teacher_config}


collector = PooledCollector  # what the forward pass asks this module for (kdpipe.signals.forward)


def write(settings: SignalSettings, meta: dict, parts, out_dir: Path) -> dict:
    """``pooled.npy`` + ``pooled.json`` in ``out_dir`` from every shard's part."""
    data_file, manifest_file = (out_dir / name for name in SIGNALS["pooled"].files)
    ensure_disk_space(data_file, 4 * meta["rows"] * meta["hidden_size"], "the pooled states", hint="free space")
    with atomic_path(data_file) as tmp:
        gather_array(parts, "pooled", meta["rows"], out=tmp)
    manifest = make_manifest("pooled", config=settings, split=settings.split, **meta)
    return write_manifest(manifest_file, manifest, [data_file.name])
