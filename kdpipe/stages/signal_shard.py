"""The ``signal_shard`` stage: one shard of a teacher signal pass over one split, as a part folder.

Which signals the pass makes is ``params["signals"]`` (their config slices: the teacher's shared forward pass, or
MC-dropout; :mod:`kdpipe.signals.catalog`); the protocol is :mod:`kdpipe.signals.shards`.
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.signals.shards import run_shard


def run(params: dict, teacher: Path, data: Path, shard: str, out_part: Path) -> None:
    """Compute shard ``shard`` (``"k-of-S"``) of the pass for the teacher in ``teacher`` into ``out_part``."""
    run_shard(params["signals"], teacher, data, shard, out_part)
