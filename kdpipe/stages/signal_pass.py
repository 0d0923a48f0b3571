"""The ``signal_pass`` stage: a teacher signal pass over a whole split (S = 1), writing its signals' artifacts
itself, without a gather job: the same bytes as S shards gathered (:mod:`kdpipe.signals.shards`).

Which signals the pass makes is ``params["signals"]`` (their config slices): every deterministic signal the config
needs of the teacher on the split, from one forward pass (:mod:`kdpipe.signals.forward`), or MC-dropout.
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.signals.shards import run_pass


def run(params: dict, teacher: Path, data: Path, out: Path) -> dict:
    """Write the files of every signal of the pass into the signal folder ``out``; return their manifests."""
    return run_pass(params["signals"], teacher, data, out)
