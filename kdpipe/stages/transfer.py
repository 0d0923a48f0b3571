"""The ``transfer`` stage: the unlabelled transfer rows as a one-split dataset artifact (kdpipe.data.transfer)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.data.transfer import build_transfer


def run(params: dict, data: Path, out: Path) -> dict:
    """Read ``dataset.transfer`` and the withheld training rows of the prepared dataset ``data``; write ``out``."""
    return build_transfer(params, data, out)
