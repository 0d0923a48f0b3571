"""The ``signal_shard`` stage: one shard of a teacher signal pass over one split, as a part folder.

Which signals the pass makes is ``params["signals"]`` (their config slices: the teacher's shared forward pass, or
MC-dropout; :mod:`kdpipe.signals.catalog`), or one signal's slice (a pass of it alone, as the benchmarks run it);
the protocol is :mod:`kdpipe.signals.shards`.
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.signals.shards import run_shard


def run(params: dict, teacher: Path, data: Path, shard: str, out_part: Path) -> None:
    """Compute shard ``shard`` (``"k-of-S"``) of the pass for the teacher in ``teacher`` into ``out_part``."""
    run_shard(params.get("signals", [params]), teacher, data, shard, out_part)  # one signal's slice: that one alone
