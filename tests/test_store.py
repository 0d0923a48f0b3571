"""Atomic writes (docs/design.md, "Contracts"): a process killed mid-write leaves only a hidden temporary path, and
the next write of the same path removes it, never a live writer's or another host's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from kdpipe.core import store
from kdpipe.core.store import atomic_path

# a child that starts writing `out` (a folder) under atomic_path and waits to be killed
WRITER = """
import sys, time
from kdpipe.core.store import atomic_path
with atomic_path(sys.argv[1], directory=True) as tmp:
    (tmp / "part.bin").write_bytes(b"x" * 1000)
    print("writing", flush=True)
    time.sleep(60)
"""


def left_behind(out):
    return sorted(p.name for p in out.parent.glob(f".{out.name}.tmp-*"))


def test_a_killed_writers_temporary_folder_is_removed_by_the_next_write(tmp_path):
    out = tmp_path / "dump"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    live = left_behind(out)
    assert len(live) == 1 and f"-{child.pid}-" in live[0]
    with atomic_path(tmp_path / "other", directory=True):  # another path's write leaves it alone
        pass
    store._remove_left_behind(out)  # (what a write of the same path does first) the writer is alive: its folder stays
    assert left_behind(out) == live
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert not out.exists() and left_behind(out) == live  # nothing looks finished; the temporary folder stays
    with atomic_path(out, directory=True) as tmp:
        (tmp / "done").write_text("1")
        assert left_behind(out) == [tmp.name]  # the killed writer's is gone, this one's is there
    assert (out / "done").read_text() == "1" and left_behind(out) == []


def test_another_hosts_temporary_file_is_kept(tmp_path, monkeypatch):
    out = tmp_path / "logits.parquet"
    theirs = tmp_path / f".logits.parquet.tmp-{store._HOST}x-1-abc"  # (a host whose name starts like ours)
    dead = tmp_path / f".logits.parquet.tmp-{store._HOST}-{2**22 + 7}-abc"  # (above the largest pid Linux gives)
    theirs.write_text("")
    dead.write_text("")
    with atomic_path(out) as tmp:
        tmp.write_text("ok")
    assert theirs.exists() and not dead.exists()


def test_a_scratch_folder_is_hidden_removed_and_sweeps_a_killed_ones(tmp_path):
    from kdpipe.core.store import scratch_folder

    near = tmp_path / "signals" / "pass"
    left = near.parent / f".pass.tmp-{store._HOST}-{2**22 + 7}-abc"  # a killed process's (no such pid)
    left.mkdir(parents=True)
    with scratch_folder(near) as tmp:
        (tmp / "part").mkdir()
        assert tmp.name.startswith(".pass.tmp-") and not left.exists()
    assert list(near.parent.iterdir()) == []
