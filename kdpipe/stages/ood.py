"""The ``ood`` stage: an external out-of-distribution set as a one-split dataset artifact (kdpipe.data.ood)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.data.ood import build_ood


def run(params: dict, data: Path, out: Path, transfer: list[Path] = ()) -> dict:
    """Read ``evaluate.ood.source``, drop empty, repeated, dataset and transfer texts; write ``out``."""
    return build_ood(params, data, out, transfer[0] if transfer else None)
