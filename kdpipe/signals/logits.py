"""The ``logits`` signal: eval-mode teacher logits of one split, for distillation from the cache.

``logits.parquet`` (row_id, logits: fixed-size list<float32>[C_teacher], split row order) + ``logits.json``.
Runs as S shards gathered into the same bytes as one pass (:mod:`kdpipe.signals.shards`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import pick_device
from kdpipe.core.store import atomic_path, ensure_disk_space, make_manifest
from kdpipe.models.inference import pass_batches, predict_logits
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.io import write_logits
from kdpipe.signals.shards import gather_array, shard_rows
from kdpipe.signals.teacher import open_teacher


def compute(params: dict, teacher_dir: Path, data_dir: Path, shard: tuple[int, int], part: Path):
    """Write the shard's logits and row ids into the part folder ``part``; return (rows, manifest fields)."""
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"])
    teacher.model.to(device)
    logits = predict_logits(
        teacher.model,
        teacher.encoded,
        batch_size=params["batch_size"],
        device=device,
        desc=f"logits {params['split']}",
        shard=shard,
    )
    rows = shard_rows(pass_batches(teacher.encoded, params["batch_size"], shard))
    np.save(part / "row_id.npy", teacher.encoded.row_ids[rows])
    np.save(part / "logits.npy", logits[rows])
    return rows, {"rows": len(teacher.encoded), "labels": teacher.labels, "teacher": teacher.teacher_config}


def write(params: dict, meta: dict, parts, out_dir: Path) -> dict:
    """``logits.parquet`` + ``logits.json`` in ``out_dir`` from the parts of every shard."""
    data_file, manifest_file = (out_dir / name for name in SIGNALS["logits"].files)
    ensure_disk_space(data_file, 8 * meta["rows"] * (len(meta["labels"]) + 1), "the logits", hint="free space")
    with atomic_path(data_file) as tmp:
        write_logits(tmp, gather_array(parts, "row_id", meta["rows"]), gather_array(parts, "logits", meta["rows"]))
    manifest = make_manifest("logits", config=params, split=params["split"], **meta)
    return write_manifest(manifest_file, manifest, [data_file.name])
