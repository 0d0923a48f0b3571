"""Two runs sharing one output cache never make the same teacher twice.

See docs/caching-and-reruns.md, "Two runs at once".

Snakemake looks a cached job up in the cache (``SNAKEMAKE_OUTPUT_CACHE``) when the job is about to run and stores
its output after it ends; two runs that start the same job before either has stored it would both train it, and the
second store would nest its copy inside the first entry. So a job of a cached rule takes a lock named by its
identity in the cache folder (``.kdpipe-locks/<identity>.lock``), held until the process ends, and records where
its output is (``<identity>.json``) when it has made it. A second job of the same identity waits for the lock
(saying which process holds it), then:

- when the other run's Snakemake has stored the output in the cache (its output is now a link into the cache), it
  stops without training and says so; Snakemake's retry (the rules are retried once when ``--cache`` is on) finds
  the entry and links it, as for any cached job;
- when that run does not cache it, the job copies the other run's output (verified against its manifest) instead
  of training;
- when the other job did not finish (it failed or was killed), the job runs.

A job of a run that uses the cache (``--cache``) that finds the lock free, but a record younger than ``RACE_S`` by
the cache folder's clock (the other job ended between this run's look-up and this job's start), stops in the same
way once the other run has stored the output (a link into this cache), waiting up to ``STORE_WAIT_S``, and
otherwise runs. A run without ``--cache`` never looks the cache up or stores, so its jobs ignore such records.

``flock`` locks hold across the processes of one machine and on most shared file systems (NFS v4, Lustre, GPFS);
where the cache folder's file system ignores them, two runs may each make the artifact, as without the lock.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from kdpipe.core.finished import copy_into, folder_damage, take_lock
from kdpipe.core.store import KdpipeError, atomic_path

CACHE_ENV = "SNAKEMAKE_OUTPUT_CACHE"
LOCKS = ".kdpipe-locks"
# How long to wait for the other run's Snakemake to move a finished output into the cache before copying it
STORE_WAIT_S = 60.0
# A record this young, found with the lock free by a job of a run that uses the cache, may be of a job whose store
# came after this run's cache look-up (the look-up is just before the job's process starts; the store begins just
# after the other job's process ends); the job then waits up to STORE_WAIT_S for that store
RACE_S = 20.0
# Set by the workflow (workflow/rules/common.smk) when this run uses the cache (--cache)
CACHED_RUN_ENV = "KDPIPE_CACHED_RUN"


class StoredMeanwhile(KdpipeError):
    """The same job was made by another run and is in the cache now: this job stops without making it again."""


_HELD: dict[str, object] = {}  # identity -> open lock handle, held until the process ends


def _folder() -> Path | None:
    cache = os.environ.get(CACHE_ENV)
    return Path(cache) / LOCKS if cache and Path(cache).is_dir() else None


def claim(identity: str, out_dirs: list[Path]) -> bool:
    """Take the cache lock of ``identity`` (waiting while another process holds it). Returns True when the outputs
    were copied from the other run's finished outputs (nothing to make); raises :class:`StoredMeanwhile` when they
    are in the cache now. Without a cache folder it does nothing."""
    folder = _folder()
    if folder is None:
        return False
    folder.mkdir(parents=True, exist_ok=True)
    _shared(folder, 0o2775)
    lock = folder / f"{identity}.lock"
    lock.touch()
    _shared(lock, 0o664)
    made = folder / f"{identity}.json"
    waiting = f"{', '.join(map(str, out_dirs))}: another run sharing the cache is making it ({{holder}}); waiting"
    _HELD[identity], waited_since = take_lock(lock, waiting, holder=f" in {Path.cwd()}")
    # Only a job finished while this one waited counts, or, in a run that uses the cache, one finished just before
    # this one started: an older record is of a run whose cache entry Snakemake would have found (or that was
    # deleted since), and this job makes the output as usual.
    if waited_since is None and os.environ.get(CACHED_RUN_ENV) != "1":
        return False
    try:
        written = made.stat().st_mtime
        if waited_since is None:
            lock.touch()  # "now" by the clock of the cache folder's file system, which dated the record
            now = lock.stat().st_mtime
            if not now - RACE_S <= written <= now + 1.0:
                return False
        elif written < waited_since:
            return False
        sources = [Path(p) for p in json.loads(made.read_text())["outputs"]]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if len(sources) != len(out_dirs) or {s.absolute() for s in sources} & {o.absolute() for o in out_dirs}:
        return False  # (a record of this job's own outputs, from an earlier try of it)
    if waited_since is None:
        # the other job ended moments before this one started: its store may have come after this run's look-up
        _stop_if_stored(
            sources,
            out_dirs,
            folder.parent,
            "made by another run sharing the cache moments before this job started and stored there after this run "
            "looked it up",
        )
        return False
    _stop_if_stored(
        sources, out_dirs, folder.parent, "made meanwhile by another run sharing the cache and stored there"
    )
    return _copy(sources, out_dirs)


def _stop_if_stored(sources: list[Path], out_dirs: list[Path], cache: Path, made: str) -> None:
    """Wait up to ``STORE_WAIT_S`` for the other run's Snakemake to store its finished output (it does so right
    after that run's job ends; a copy first when the cache is on another file system), and raise
    :class:`StoredMeanwhile` once it is: a link to an existing entry of this cache folder."""
    deadline = time.monotonic() + STORE_WAIT_S
    if not _stored(sources, cache):
        _say(
            f"{', '.join(map(str, out_dirs))}: made by another run sharing the cache "
            f"({', '.join(map(str, sources))}); waiting up to {STORE_WAIT_S:.0f} s for it to be stored"
        )
    while not _stored(sources, cache) and time.monotonic() < deadline:
        time.sleep(0.5)
    if _stored(sources, cache):
        raise StoredMeanwhile(
            f"{', '.join(map(str, out_dirs))}: {made}; this job stops without making it again: Snakemake's retry, "
            "or your rerun, links it from the cache"
        )


def _stored(sources: list[Path], cache: Path) -> bool:
    """Every source is a link to an existing entry of ``cache``."""
    root = cache.resolve()
    return all(s.is_symlink() and s.resolve().is_dir() and s.resolve().is_relative_to(root) for s in sources)


def _copy(sources: list[Path], out_dirs: list[Path]) -> bool:
    """Copy the other run's finished outputs (not stored: that run does not cache them), unless one is damaged."""
    if any(folder_damage(source) for source in sources):
        return False
    for source, out in zip(sources, out_dirs):
        copy_into(source, out, f"copied from {source}, made meanwhile by another run of the same job (nothing trained)")
    return True


def _shared(path: Path, mode: int) -> None:
    """Make the locks usable by the other members of a lab's group, whatever this process's umask: a cache folder
    is shared by its group (docs/caching-and-reruns.md, "The between-workflow cache")."""
    try:
        if path.stat().st_uid == os.getuid():
            path.chmod(mode)
    except OSError:  # another user's file: its owner set it
        pass


def held() -> list:
    """The open handles of the cache locks this process holds (kept open across the exec into ``torchrun``)."""
    return list(_HELD.values())


def record(identity: str, out_dirs: list[Path]) -> None:
    """Say, for a later job of the same identity, that ``out_dirs`` are made (called by the process that holds the
    lock, or by the first rank of a job whose launcher took it)."""
    folder = _folder()
    if folder is None or not identity:
        return
    with atomic_path(folder / f"{identity}.json") as tmp:
        tmp.write_text(json.dumps({"outputs": [str(Path(out).absolute()) for out in out_dirs]}))
    _shared(folder / f"{identity}.json", 0o664)


def _say(message: str) -> None:
    print(f"[kdpipe] {message}", file=sys.stderr)
