"""Finished outputs kept for a rerun of the same job.

See docs/caching-and-reruns.md, "A finished job recorded as incomplete".

Snakemake stopped by a signal while a job runs (or a cluster job that outlives the Snakemake that submitted it) lets
the job finish but leaves its output recorded as incomplete; the rerun (``--rerun-incomplete``) deletes the output
and runs the job again. A training job therefore keeps a copy of its finished output folder beside it
(``.resume/<name>.done``: a real copy, so damage to one never reaches the other) with the job's identity
(:func:`kdpipe.core.identity.job_identity`: settings, local files, inputs, the stage's code fingerprint). The copy is
used only for that case:

- only by a job of the same identity, and only when every file of the copy still has the checksum its manifest
  records;
- never in a run started with ``--forcerun``, ``--forceall`` or ``--force`` (the workflow sets
  :data:`NO_RESTORE`);
- only when the output existed when the run started (an output deleted by hand is made again): the workflow's
  ``onstart`` drops the other copies (:func:`drop_finished_copies`);
- only after a Snakemake that did not end normally: a run that ends, with success or an error, saw every job it
  ran finish, so its ``onsuccess``/``onerror`` drop every copy.

Torch-free: it runs before a GPU is claimed.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

from kdpipe.core.identity import what_changed
from kdpipe.core.store import ArtifactError, atomic_path, read_json

# What a finished output was made from, set by the command line for the training stages (kdpipe.cli); None when a
# stage is called directly, and then no copy is kept.
_JOB_IDENTITY: str | None = None
# Set (to "1") by the workflow when the run forces jobs to run again: no finished copy is restored then.
NO_RESTORE = "KDPIPE_NO_RESTORE"
RESUME = ".resume"
# How often a lock wait that can be called off (take_lock's ``stop``) tries the lock again: how soon it ends
LOCK_POLL_S = 0.2


def set_job_identity(identity: str | None) -> None:
    global _JOB_IDENTITY
    _JOB_IDENTITY = identity


def job_identity_of_process() -> str | None:
    """The identity set by :func:`set_job_identity` (passed on to the ranks of a multi-process job)."""
    return _JOB_IDENTITY


def work_dir(out_dir: str | Path) -> Path:
    """The folder beside an output that holds its job's resume checkpoints, training log, lock and kept copy
    (outside the output: Snakemake deletes declared outputs before a rerun)."""
    return Path(out_dir).parent / RESUME


def finished_copy(out_dir: str | Path) -> Path:
    """Where the copy of a finished output is kept (its identity beside it)."""
    return work_dir(out_dir) / f"{Path(out_dir).name}.done"


def _identity_file(done: Path) -> Path:
    return done.with_name(done.name + ".identity")


def keep_finished(out_tmp: Path, out_dir: Path) -> None:
    """Replace the kept copy of ``out_dir`` by a copy of ``out_tmp`` (its finished output, not yet in place), when
    the job's identity is known."""
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
    """Drop the kept copies under every ``root`` (``results/teachers``, ``results/students``...); with
    ``keep_if_output_exists``, keep those whose output exists now (it may be an output Snakemake recorded as
    incomplete, which this run deletes and reruns). Returns the copies dropped."""
    dropped = []
    for root in roots:
        for done in sorted((Path(root) / RESUME).glob("*.done")):
            if keep_if_output_exists and (Path(root) / done.name.removesuffix(".done")).exists():
                continue
            _drop(done)
            dropped.append(done)
    return dropped


def restore_finished(identity: str, out_dirs: list[Path]) -> bool:
    """When every output of a job was already finished by a job of this ``identity`` (it completed, then its
    outputs were deleted as incomplete because Snakemake was stopped before it noticed), put back copies of them
    and return True. A copy of another identity, or one whose files no longer match its manifest, is removed with
    a log line; in a run that forces jobs (:data:`NO_RESTORE`) nothing is restored."""
    if os.environ.get(NO_RESTORE) == "1":
        return False
    copies = [finished_copy(Path(out)) for out in out_dirs]
    for done in copies:
        marker = _identity_file(done)
        if not marker.is_file() or not done.is_dir():
            _drop(done)
            return False
        if marker.read_text() != identity:
            _say(f"{done}: a finished copy made from {what_changed(marker.read_text(), identity)}; removed, not used")
            _drop(done)
            return False
        damage = folder_damage(done)
        if damage:
            _say(f"{done}: {damage}; removed, not used (the job runs again)")
            _drop(done)
            return False
    for done, out in zip(copies, out_dirs):
        copy_into(done, out, "restored, already finished by this same job (nothing trained)")
    return True


def copy_into(source: Path, out: Path, why: str) -> None:
    """Put a copy of the finished folder ``source`` at ``out`` atomically and say ``why`` in the job's log."""
    with atomic_path(out, directory=True) as tmp:
        shutil.copytree(source, tmp, dirs_exist_ok=True)
    _say(f"{out}: {why}")


def folder_damage(done: Path) -> str | None:
    """Why a finished folder cannot be used (a file differs from the checksum its manifest records, or the
    manifest records none), or None."""
    from kdpipe.core.checksums import verify

    try:
        manifest = read_json(done / "manifest.json")
        listed = manifest.get("checksums") or {}
        if not listed:
            return "its manifest lists no checksums"
        verify(manifest, done / "manifest.json", listed, done)
    except ArtifactError as err:
        return str(err).split(";")[0]
    return None


def _say(message: str) -> None:
    print(f"[kdpipe] {message}", file=sys.stderr)


_LOCKS: dict = {}  # lock file -> its open handle, held until the process ends (released by the OS, also on SIGKILL)


def held_locks() -> list:
    """The open handles of the output locks this process holds."""
    return list(_LOCKS.values())


def lock_outputs(out_dirs: list[Path]) -> None:
    """Take an exclusive lock per output (``.resume/<name>.lock``) for the rest of this process. A second job for the
    same output (a rerun after ``--unlock`` while a job of the killed Snakemake still runs as an orphan) waits for
    the first to end, saying which process it waits for: only then does it look at what is there, so that the
    orphan's output, written when it ends, is used only if it has this job's identity (restored from its kept copy)
    and is otherwise replaced, never taken for this job's."""

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
    """An exclusive ``flock`` on the file ``path``, held as long as the returned handle is open (the system releases
    it when the process ends, even on SIGKILL). When another process holds it, say ``waiting`` (``{holder}``: what
    that process wrote in the file) and wait for it, without a time limit; with ``stop`` (a ``threading.Event``),
    give up as soon as it is set and return None (the wait tries the lock again every :data:`LOCK_POLL_S`). The
    file then names this process (pid, host, and ``holder``)."""
    import fcntl

    handle = open(path, "a+")  # noqa: SIM115 (held open on purpose: the lock lives as long as the file is open)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        _say(waiting.format(holder=handle.read().strip() or "another process"))
        if stop is None:
            fcntl.flock(handle, fcntl.LOCK_EX)
        elif not _wait_for_lock(handle, stop):
            handle.close()
            return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"pid {os.getpid()} on {socket.gethostname()}{holder}")
    handle.flush()
    return handle


def _wait_for_lock(handle, stop) -> bool:
    """Wait for the lock on ``handle`` until it is taken (True) or ``stop`` is set (False): ``flock`` itself cannot
    be interrupted from another thread, so the lock is tried again every :data:`LOCK_POLL_S`."""
    import fcntl

    while not stop.wait(LOCK_POLL_S):
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            continue
    return False
