"""The ``prototypes`` stage: Meta-KD's prototype scores of the train rows (docs/methods.md §4)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.methods.meta_kd.prototypes import write_prototype_scores


def run(params: dict, data: Path, out: Path) -> dict:
    """Score every train row of ``data`` against the class prototypes; write ``out`` (Parquet) and its manifest."""
    return write_prototype_scores(params, data, out)
