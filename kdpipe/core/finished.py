"""Finished outputs kept for a rerun of the same job (docs/caching-and-reruns.md, "Interrupted jobs and resume").

Snakemake stopped by a signal while a job runs lets the job finish but records it as incomplete; the rerun
(``--rerun-incomplete``) deletes the outputs and runs the job again. A training job therefore keeps a copy of its
finished output folder beside it (``.resume/<name>.done``, hard links: no extra space while the output exists) with
the job's identity (:func:`kdpipe.core.checksums.job_identity`: settings, inputs, code); the command line restores
it at once when the same job runs again. Torch-free: it runs before a GPU is claimed.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

from kdpipe.core.store import KdpipeError, atomic_path

# What a finished output was made from (config slice, input artifacts, kdpipe's code), set by the command line for
# the training stages (kdpipe.cli); None when a stage is called directly, and then no copy is kept.
_JOB_IDENTITY: str | None = None


def set_job_identity(identity: str | None) -> None:
    global _JOB_IDENTITY
    _JOB_IDENTITY = identity


def job_identity_of_process() -> str | None:
    """The identity set by :func:`set_job_identity` (passed on to the ranks of a multi-process job)."""
    return _JOB_IDENTITY


def keep_finished(out_tmp: Path, resume: Path) -> None:
    """Replace the kept copy of the job whose resume folder is ``resume`` by ``out_tmp`` (its finished output),
    when the job's identity is known."""
    done = _copy_of(resume)
    _drop(done)
    if _JOB_IDENTITY is not None:
        _link_tree(out_tmp, done)
        done.with_name(done.name + ".identity").write_text(_JOB_IDENTITY)


def _copy_of(resume: Path) -> Path:
    return resume.with_name(resume.name + ".done")


def finished_copy(out_dir: Path) -> Path:
    """Where the linked copy of a finished output is kept (its identity beside it)."""
    out_dir = Path(out_dir)
    return out_dir.parent / ".resume" / f"{out_dir.name}.done"


def _drop(done: Path) -> None:
    shutil.rmtree(done, ignore_errors=True)
    done.with_name(done.name + ".identity").unlink(missing_ok=True)


def _link_tree(source: Path, target: Path) -> None:
    """``target`` as a copy of ``source`` made of hard links (copies where the file system has none)."""
    for path in sorted(source.rglob("*")):
        dest = target / path.relative_to(source)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:
            shutil.copy2(path, dest)


def restore_finished(identity: str, out_dirs: list[Path]) -> bool:
    """When every output of a job was already finished by a job of this ``identity`` (it completed, then its
    outputs were deleted as incomplete because Snakemake was stopped before it noticed), put them back from the
    copies :func:`finish` kept and return True; a copy of another identity is stale and removed."""
    copies = [finished_copy(Path(out)) for out in out_dirs]
    for done in copies:
        marker = done.with_name(done.name + ".identity")
        if not marker.is_file() or marker.read_text() != identity or not done.is_dir():
            _drop(done)
            return False
    for done, out in zip(copies, out_dirs):
        with atomic_path(out, directory=True) as tmp:
            _link_tree(done, tmp)
        print(f"[kdpipe] {out}: restored, already finished by this same job (nothing trained)", file=sys.stderr)
    return True


_LOCKS: dict = {}  # lock file -> its open handle, held until the process ends (released by the OS, also on SIGKILL)


def held_locks() -> list:
    """The open handles of the output locks this process holds."""
    return list(_LOCKS.values())


def lock_outputs(out_dirs: list[Path]) -> None:
    """Take an exclusive lock per output (``.resume/<name>.lock``) for the rest of this process: a second job for the
    same output (an orphan of a killed Snakemake still running, then a rerun after ``--unlock``) stops at once,
    naming the process that holds it, instead of training into the same resume folder."""
    import fcntl

    for out in out_dirs:
        out = Path(out)
        path = out.parent / ".resume" / f"{out.name}.lock"
        if path in _LOCKS:  # this process holds it already
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")  # noqa: SIM115 (held open on purpose: the lock lives as long as the file is open)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise KdpipeError(
                f"{out}: another job is already making it ({holder}); wait for it to end or stop it, then rerun"
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        _LOCKS[path] = handle
