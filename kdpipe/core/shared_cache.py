"""Two runs sharing one output cache make each cached artifact once (docs/caching-and-reruns.md, "Two runs at once").

Snakemake's between-workflow cache (rules marked ``cache: True``, ``--cache``, ``SNAKEMAKE_OUTPUT_CACHE``) looks a
job up just before it runs and moves its output into the cache just after it ends. Two runs that reach the same
job between those moments would both make it, and the second store of a folder output lands inside the first
entry. In a run with ``--cache``, :func:`install` makes each cached job hold an exclusive lock, named by the job's
cache key (Snakemake's own hash of it), from its look-up to its store: a second run's job waits for the lock, then
looks up, finds the entry and links it. Nothing is timed: the lock is a ``flock``, which the kernel releases when
the Snakemake that holds it ends, however it ends. A run without ``--cache`` neither looks up nor stores, and
nothing here runs in it.

``flock`` locks hold across the processes of one machine and on most shared file systems (NFS v4, Lustre, GPFS).
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from kdpipe.core.finished import take_lock

CACHE_ENV = "SNAKEMAKE_OUTPUT_CACHE"
LOCKS = ".kdpipe-locks"
_WHY = {
    errno.ENOENT: "it does not exist",
    errno.ENOTDIR: "it is not a folder",
    errno.EROFS: "it is on a read-only file system",
    errno.EACCES: "you may not write to it",
    errno.EPERM: "you may not write to it",
    errno.ENOSPC: "its file system is full",
    errno.EDQUOT: "your disk quota there is used up",
}


def folder_problem(cache: str) -> str | None:
    """What keeps a run from storing in the cache folder ``cache``, in a few words, or None: the folder is made
    to take the locks' folder and a small file (a missing, read-only or full folder fails here)."""
    try:
        (Path(cache) / LOCKS).mkdir(exist_ok=True)
        _group_writable(Path(cache) / LOCKS, 0o2775)
        with tempfile.TemporaryFile(dir=cache) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        return _WHY.get(err.errno, err.strerror or str(err))
    return None


def install(workflow) -> None:
    """For a run with ``--cache`` that stores in a folder: stop at once, with one line, when the folder cannot
    take the outputs (:func:`folder_problem`), and lock every cached job's look-up, run and store by its key."""
    if workflow.workflow_settings.cache is None or workflow.dryrun or not os.environ.get(CACHE_ENV):
        return
    storage = workflow.storage_settings
    if storage is not None and storage.default_storage_provider is not None:
        return  # a cache in remote storage: no folder to lock in
    cache = os.environ[CACHE_ENV]
    problem = folder_problem(cache)
    if problem:
        from snakemake.exceptions import WorkflowError

        raise WorkflowError(
            f"{CACHE_ENV}={cache}: {problem}; --cache stores the cached rules' outputs there: fix the folder, "
            f"or run without --cache"
        )
    from snakemake.executors.local import Executor

    if not getattr(Executor.cached_or_run, "kdpipe_locked", False):
        Executor.cached_or_run = _locked(Executor.cached_or_run, Path(cache) / LOCKS)


def _locked(cached_or_run, locks: Path):
    """Snakemake's look-up, run and store of one job (``Executor.cached_or_run``), under the lock of its key."""

    def locked(executor, job, run_func, *args):
        cache = executor.workflow.output_file_cache
        if cache is None or not (job.rule.cache and job.rule.cache.output):
            return cached_or_run(executor, job, run_func, *args)
        key = executor.workflow.async_run(cache.provenance_hash_map.get_provenance_hash(job))
        outputs = ", ".join(map(str, job.output))
        lock = locks / f"{key}.lock"
        lock.touch()
        _group_writable(lock, 0o664)
        handle = take_lock(
            lock,
            f"{outputs}: another run sharing the cache is making it ({{holder}}); waiting for it to be stored",
            holder=f" in {Path.cwd()}",
        )
        try:
            return cached_or_run(executor, job, run_func, *args)
        finally:
            handle.close()

    locked.kdpipe_locked = True
    return locked


def _group_writable(path: Path, mode: int) -> None:
    """Let the other members of a lab's group take the locks, whatever this process's umask: a cache folder is
    shared by its group (docs/caching-and-reruns.md, "The between-workflow cache")."""
    try:
        if path.stat().st_uid == os.getuid():
            path.chmod(mode)
    except OSError:  # another user's file: its owner set it
        pass
