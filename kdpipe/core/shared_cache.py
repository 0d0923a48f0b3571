"""Two runs sharing one output cache make each cached artifact once (docs/caching-and-reruns.md, "Two runs at once").

In a run with ``--cache``, :func:`install` wraps Snakemake's look-up, run and store of each cached job in a ``flock``
named by its cache key, and stores under it with kdpipe's own atomic store (:func:`_store`). This wraps Snakemake's
private code, checked with the versions :data:`CHECKED`.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import tempfile
import threading
from pathlib import Path

from kdpipe.core.finished import say, take_lock

CACHE_ENV = "SNAKEMAKE_OUTPUT_CACHE"
LOCKS = ".kdpipe-locks"
# The Snakemake releases whose executor (Executor.cached_or_run) and cache (OutputFileCache) this was checked with,
# from the first with today's cache interface to the one kdpipe pins (tests/test_shared_cache.py)
CHECKED = ((9, 18), (9, 27))
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
    """What keeps a run from writing in the cache folder ``cache`` or its locks' folder, in a few words, or None."""
    locks = Path(cache) / LOCKS
    try:
        locks.mkdir(exist_ok=True)
        _group_writable(locks, 0o2775)
        _probe(cache)
    except OSError as err:
        return _why(err)
    try:
        _probe(locks)  # a lock of a new key is a new file there
    except OSError as err:
        return f"its locks' folder {locks}: {_why(err)}"
    return None


def _probe(folder: str | Path) -> None:
    with tempfile.TemporaryFile(dir=folder) as probe:
        probe.write(b"\0" * 4096)
        probe.flush()
        os.fsync(probe.fileno())


def install(workflow) -> None:
    """For a run with ``--cache`` in a folder (not a dry run): check the folder, lock every cached job by its key."""
    dry = workflow.dryrun or getattr(workflow.output_settings, "dryrun", False)
    if workflow.workflow_settings.cache is None or dry or not os.environ.get(CACHE_ENV):
        return
    storage = workflow.storage_settings
    if storage is not None and storage.default_storage_provider is not None:
        return  # a cache in remote storage: no folder to lock in
    from snakemake.exceptions import WorkflowError
    from snakemake.executors.local import Executor
    from snakemake.scheduling.job_scheduler import JobScheduler

    cache = os.environ[CACHE_ENV]
    problem = unchecked_snakemake()
    if problem:
        raise WorkflowError(f"--cache: {problem}, or run without --cache")
    problem = folder_problem(cache)
    if problem:
        raise WorkflowError(
            f"{CACHE_ENV}={cache}: {problem}; --cache stores the cached rules' outputs there: fix the folder, "
            "or run without --cache"
        )
    workflow.kdpipe_locks = Path(cache) / LOCKS
    workflow.kdpipe_stop = threading.Event()  # set when the run stops: a wait for a lock ends then
    if not getattr(Executor.cached_or_run, "kdpipe_locked", False):
        Executor.cached_or_run = _locked(Executor.cached_or_run)
        Executor.cancel = _stopping(Executor.cancel)  # Ctrl-C (and any error of the scheduler)
        Executor.shutdown = _stopping(Executor.shutdown)
        JobScheduler.exit_gracefully = _stopping(JobScheduler.exit_gracefully)  # SIGTERM


def unchecked_snakemake(version: str | None = None) -> str | None:
    """What is wrong with the installed Snakemake for the lock, or None: a release outside :data:`CHECKED`."""
    if version is None:
        from snakemake import __version__ as version
    release = tuple(int(part) for part in version.split(".")[:2])
    if CHECKED[0] <= release <= CHECKED[1]:
        return None
    low, high = (".".join(map(str, v)) for v in CHECKED)
    return (
        f"Snakemake {version} is not one kdpipe's lock around the cache was checked with ({low} to {high}); "
        "install one of those"
    )


def _stopping(method):
    """``method`` of Snakemake's executor or scheduler, first setting the run's stop event (its ``workflow``)."""

    def stopping(self, *args):
        stop = getattr(self.workflow, "kdpipe_stop", None)
        if stop is not None:
            stop.set()
        return method(self, *args)

    return stopping


def _locked(cached_or_run):
    """Snakemake's look-up, run and store of one job (``Executor.cached_or_run``), under the lock of its key."""

    def locked(executor, job, run_func, *args):
        workflow = executor.workflow
        cache = workflow.output_file_cache
        locks = getattr(workflow, "kdpipe_locks", None)
        if cache is None or locks is None or not (job.rule.cache and job.rule.cache.output):
            return cached_or_run(executor, job, run_func, *args)
        from snakemake.exceptions import WorkflowError

        key = workflow.async_run(cache.provenance_hash_map.get_provenance_hash(job))
        outputs = ", ".join(map(str, job.output))
        stop = getattr(workflow, "kdpipe_stop", None)
        lock = locks / f"{key}.lock"
        try:
            lock.touch()
            _group_writable(lock, 0o664)
            handle = take_lock(
                lock,
                f"{outputs}: another run sharing the cache is making it ({{holder}}); waiting for it to be stored",
                holder=f" in {Path.cwd()}",
                stop=stop,
            )
        except OSError as err:
            raise WorkflowError(f"{outputs}: cannot take the lock {lock} ({_why(err)}); not run") from None
        if handle is None or (stop is not None and stop.is_set()):
            if handle is not None:
                handle.close()
            # said here, not only in the error: a signal that lands while Snakemake is still submitting the job
            # leaves the job's future without the callback that prints its error
            say(f"{outputs}: not run: the run was stopped while the job waited for the cache lock")
            raise WorkflowError(f"{outputs}: not run (the run was stopped)")
        try:
            # Snakemake's look-up, run and store (Executor.acached_or_run), but a forced job is not looked up
            if not _forced(workflow, job) and workflow.async_run(cache.exists(job)):
                workflow.async_run(job.rule.cache.fetch(job))
                return None
            run_func(*args)
            _store(workflow, cache, job, locks / f"{key}.storing")
        finally:
            handle.close()
        return None

    locked.kdpipe_locked = True
    return locked


def _forced(workflow, job) -> bool:
    """Whether the run forces ``job`` (``--forcerun``, ``--forceall``, ``--force``), not just an incomplete one."""
    settings = workflow.dag_settings
    if not (settings.forceall or settings.forcerun or settings.forcetargets):
        return False
    return bool(workflow.dag.reason(job).forced)


def _store(workflow, cache, job, staging: Path) -> None:
    """Store ``job``'s outputs under the lock: copied (or hard-linked) into ``staging`` (a killed store's leftovers
    removed first), renamed into the cache in place of any entry there, each whole or absent (so a Snakemake killed
    mid-store leaves no part of an entry a look-up would take), then replaced by a link to it. A copy that fails leaves
    the outputs in place and says so in one line."""
    pairs = workflow.async_run(cache.get_outputfiles_and_cachefiles(job))
    if not all(os.path.lexists(out) for out, _ in pairs):
        workflow.async_run(cache.store(job))  # Snakemake names the missing output
        return
    _remove(staging)
    staging.mkdir()
    try:
        for out, entry in pairs:
            _copy(out, staging / entry.name)
            cache.set_permissions(staging / entry.name)
    except OSError as err:
        _remove(staging)
        outputs = ", ".join(str(out) for out, _ in pairs)
        say(
            f"{outputs}: could not be stored in the shared cache {cache.path} ({_why(err)}); the output stays "
            f"in this working directory, not in the cache"
        )
        return
    for out, entry in pairs:
        _remove(entry)
        os.rename(staging / entry.name, entry)
        _remove(out)
        cache.symlink(entry, out, utime=False)
    _remove(staging)


def _copy(source: Path, target: Path) -> None:
    """``source`` (a file or a folder) as ``target``: hard links on the same file system, copies across two."""
    copy = os.link if os.stat(source).st_dev == os.stat(target.parent).st_dev else shutil.copy2
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, copy_function=copy, symlinks=True)
    else:
        copy(source, target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        path.unlink()


def _why(err: OSError) -> str:
    """Why a file operation failed, in a few words (``shutil.Error`` lists its copies' errors as text)."""
    text = err.strerror or str(err)
    if isinstance(err, shutil.Error) and err.args and isinstance(err.args[0], list) and err.args[0]:
        text = str(err.args[0][0][-1])  # (the first copy's: "[Errno 28] No space left on device: ...")
    found = re.search(r"\[Errno (\d+)\]", text)
    number = err.errno or (int(found.group(1)) if found else None)
    return _WHY.get(number, text.partition("\n")[0])


def _group_writable(path: Path, mode: int) -> None:
    """Let the group sharing the cache take the locks (docs/caching-and-reruns.md, "The between-workflow cache")."""
    try:
        if path.stat().st_uid == os.getuid():
            path.chmod(mode)
    except OSError:  # another user's file: its owner set it
        pass
