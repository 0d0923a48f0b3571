"""Finished outputs kept for a rerun of the same job.

See docs/caching-and-reruns.md, "A finished job recorded as incomplete": a training job keeps a copy of its output
with its identity (:func:`keep_finished`), restored only under those rules (:func:`restore_finished`); and the output
locks (:func:`lock_outputs`). Torch-free: it runs before a GPU is claimed.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import sys
from pathlib import Path

from kdpipe.core.identity import what_changed
from kdpipe.core.store import ArtifactError, atomic_path, read_json

# What a finished output was made from, set by the command line for the training stages (None: no copy is kept)
_JOB_IDENTITY: str | None = None
# Set (to "1") by the workflow when the run forces jobs to run again: no finished copy is restored then.
NO_RESTORE = "KDPIPE_NO_RESTORE"
RESUME = ".resume"
# How often a lock wait that can be called off (take_lock's ``stop``) tries the lock again
LOCK_POLL_S = 0.2


def set_job_identity(identity: str | None) -> None:
    global _JOB_IDENTITY
    _JOB_IDENTITY = identity


def job_identity_of_process() -> str | None:
    """The identity set by :func:`set_job_identity` (passed on to the ranks of a multi-process job)."""
    return _JOB_IDENTITY


def work_dir(out_dir: str | Path) -> Path:
    """The folder beside an output (which Snakemake deletes before a rerun) for its job's checkpoints, log and lock."""
    return Path(out_dir).parent / RESUME


def finished_copy(out_dir: str | Path) -> Path:
    """Where the copy of a finished output is kept (its identity beside it)."""
    return work_dir(out_dir) / f"{Path(out_dir).name}.done"


def _identity_file(done: Path) -> Path:
    return done.with_name(done.name + ".identity")


def keep_finished(out_tmp: Path, out_dir: Path) -> None:
    """Replace the kept copy of ``out_dir`` by a copy of ``out_tmp``, its finished output, when the identity is set."""
    done = finished_copy(out_dir)
    _drop(done)
    if _JOB_IDENTITY is not None:
        with atomic_path(done, directory=True) as tmp:
            shutil.copytree(out_tmp, tmp, dirs_exist_ok=True)
        _identity_file(done).write_text(_JOB_IDENTITY)


def _drop(done: Path) -> None:
    _identity_file(done).unlink(missing_ok=True)  # first: a copy without its identity is never used
    shutil.rmtree(done, ignore_errors=True)


def drop_finished_copies(roots: list[str | Path], *, keep_if_output_exists: bool = False) -> list[Path]:
    """Drop the kept copies under every ``root`` (with ``keep_if_output_exists``, those of missing outputs)."""
    dropped = []
    for root in roots:
        for done in sorted((Path(root) / RESUME).glob("*.done")):
            if keep_if_output_exists and (Path(root) / done.name.removesuffix(".done")).exists():
                continue
            _drop(done)
            dropped.append(done)
    return dropped


def restore_finished(identity: str, out_dirs: list[Path]) -> bool:
    """Put back the kept copies of every output of a job of this ``identity`` and return True, or remove them.
    Only copies of this identity whose files match their manifest's checksums; nothing under :data:`NO_RESTORE`."""
    if os.environ.get(NO_RESTORE) == "1":
        return False
    copies = [finished_copy(Path(out)) for out in out_dirs]
    for done in copies:
        why = _unusable(done, identity)
        if why is not None:
            if why:
                say(f"{done}: {why}")
            _drop(done)
            return False
    for done, out in zip(copies, out_dirs):
        with atomic_path(out, directory=True) as tmp:
            shutil.copytree(done, tmp, dirs_exist_ok=True)
        say(f"{out}: restored, already finished by this same job (nothing trained)")
    return True


def _unusable(done: Path, identity: str) -> str | None:
    """Why the kept copy ``done`` is not restored for ``identity`` ("" when there is no whole copy), or None."""
    from kdpipe.core.checksums import verify

    marker = _identity_file(done)
    if not marker.is_file() or not done.is_dir():
        return ""
    if marker.read_text() != identity:
        return f"a finished copy made from {what_changed(marker.read_text(), identity)}; removed, not used"
    try:
        manifest = read_json(done / "manifest.json")
        listed = manifest.get("checksums") or {}
        if not listed:
            return "its manifest lists no checksums; removed, not used (the job runs again)"
        verify(manifest, done / "manifest.json", listed, done)
    except ArtifactError as err:
        return f"{str(err).split(';')[0]}; removed, not used (the job runs again)"
    return None


def say(message: str) -> None:
    """``[kdpipe] message`` on stderr (the job's log, or Snakemake's output for the cache lock)."""
    print(f"[kdpipe] {message}", file=sys.stderr, flush=True)


_LOCKS: dict = {}  # lock file -> its open handle, held until the process ends (released by the OS, also on SIGKILL)


def held_locks() -> list:
    """The open handles of the output locks this process holds."""
    return list(_LOCKS.values())


def lock_outputs(out_dirs: list[Path]) -> None:
    """Take an exclusive lock per output (``.resume/<name>.lock``) for the rest of this process: a second job for the
    same output (an orphan of a killed Snakemake) waits for the first to end, and only then looks at what is there:
    the orphan's output is restored only if it has this job's identity, never taken for this job's."""
    for out in out_dirs:
        out = Path(out)
        path = work_dir(out) / f"{out.name}.lock"
        if path in _LOCKS:  # this process holds it already
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        _LOCKS[path] = take_lock(
            path,
            f"{out}: another job is already making it ({{holder}}), e.g. one left running by a Snakemake that was "
            "killed; waiting for it to end (stop that process to go on at once)",
        )


def take_lock(path: Path, waiting: str, holder: str = "", stop=None):
    """An exclusive ``flock`` on ``path``, held while the returned handle is open; when another process holds it, say
    ``waiting`` and wait, with no time limit (None once ``stop``, a ``threading.Event``, is set). The kernel releases
    it when the process ends, even on SIGKILL. The file names the holder."""
    handle = open(path, "a+")  # noqa: SIM115 (held open on purpose: the lock lives as long as the file is open)
    if not _lock_now(handle):
        handle.seek(0)
        say(waiting.format(holder=handle.read().strip() or "another process"))
        if stop is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        else:
            while not _lock_now(handle):  # (a blocking flock cannot be interrupted from another thread)
                if stop.wait(LOCK_POLL_S):
                    handle.close()
                    return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}{holder}")
    handle.flush()
    return handle


def _lock_now(handle) -> bool:
    """Take the lock on ``handle`` if it is free; whether it was."""
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
