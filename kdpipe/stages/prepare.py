"""The ``prepare`` stage: the dataset artifact (splits, labels, manifest) from the ``dataset`` config slice."""

from __future__ import annotations

from pathlib import Path

from kdpipe.data.prepare import prepare


def run(params: dict, out: Path) -> dict:
    """Read, deduplicate and split the dataset of ``params`` into ``out`` (:mod:`kdpipe.data.prepare`)."""
    return prepare(params, out)
