"""The ``signal_gather`` stage: a teacher signal's artifact from the parts of all its shards (same bytes as one
pass; :mod:`kdpipe.signals.shards`)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.signals.shards import gather


def run(params: dict, parts: list[Path], out: Path) -> dict:
    """Write the files of ``params["signal"]`` into the signal folder ``out``; return its manifest."""
    return gather(params["signal"], params, parts, out)
