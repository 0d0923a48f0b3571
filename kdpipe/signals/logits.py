"""The ``logits`` signal: eval-mode teacher logits of one split, for distillation from the cache.

``logits.parquet`` (row_id, logits: fixed-size list<float32>[C_teacher], split row order) + ``logits.json``,
made by the teacher's shared forward pass (:mod:`kdpipe.signals.forward`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import atomic_path, ensure_disk_space, make_manifest
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.io import write_logits
from kdpipe.signals.parts import gather_array
from kdpipe.signals.settings import SignalSettings
from kdpipe.signals.teacher import TeacherPass


class LogitsCollector:
    """The logits of the shard's rows into the part folder (row_id.npy, logits.npy)."""

    hidden_states = attentions = False

    def __init__(self, settings: SignalSettings, teacher: TeacherPass, rows: np.ndarray, part: Path, device) -> None:
        self.teacher, self.rows, self.part = teacher, rows, part
        self.logits = np.zeros((len(teacher.encoded), teacher.model.config.num_labels), dtype=np.float32)

    def add(self, batch: dict, outputs) -> None:
        self.logits[batch["index"].cpu().numpy()] = outputs.logits.float().cpu().numpy()

    def finish(self) -> dict:
        np.save(self.part / "row_id.npy", self.teacher.encoded.row_ids[self.rows])
        np.save(self.part / "logits.npy", self.logits[self.rows])
        teacher = self.teacher
        return {"rows": len(teacher.encoded), "labels": teacher.labels, "teacher": teacher.teacher_config}


collector = LogitsCollector  # what the forward pass asks this module for (kdpipe.signals.forward)


def write(settings: SignalSettings, meta: dict, parts, out_dir: Path) -> dict:
    """``logits.parquet`` + ``logits.json`` in ``out_dir`` from the parts of every shard."""
    data_file, manifest_file = (out_dir / name for name in SIGNALS["logits"].files)
    ensure_disk_space(data_file, 8 * meta["rows"] * (len(meta["labels"]) + 1), "the logits", hint="free space")
    with atomic_path(data_file) as tmp:
        write_logits(tmp, gather_array(parts, "row_id", meta["rows"]), gather_array(parts, "logits", meta["rows"]))
    manifest = make_manifest("logits", config=settings, split=settings.split, **meta)
    return write_manifest(manifest_file, manifest, [data_file.name])
