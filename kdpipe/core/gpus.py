"""A lock-file GPU pool: each stage process claims one free GPU for its whole life.

Before CUDA starts, :func:`claim_gpu` takes a ``flock`` on the first free ``<pool>/gpu<i>.lock`` and sets
``CUDA_VISIBLE_DEVICES=i`` (docs/cluster.md, "GPU workstation (`profiles/workstation`)").
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kdpipe.core.store import KdpipeError

POLL_S = 0.5
DEFAULT_WAIT_S = 3600.0


def _env_number(name: str, default: float) -> float:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError as err:
        raise KdpipeError(f"{name}={text!r} is not a number") from err
    if value < 0:
        raise KdpipeError(f"{name}={text!r} is negative")
    return value


def gpu_count() -> int:
    """The number of GPUs on this machine, from ``KDPIPE_GPUS`` or ``nvidia-smi -L`` (0 when it fails)."""
    if os.environ.get("KDPIPE_GPUS", "").strip():
        return int(_env_number("KDPIPE_GPUS", 0))
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    if out.returncode != 0:
        return 0
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines())


def pool_dir() -> Path:
    """The lock folder (``KDPIPE_GPU_LOCKS``, else a per-user folder in the temp dir), created if missing."""
    default = Path(tempfile.gettempdir()) / f"kdpipe-gpus-{os.getuid()}"
    path = Path(os.environ.get("KDPIPE_GPU_LOCKS") or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KdpipeError(f"cannot create the GPU lock folder {path} (KDPIPE_GPU_LOCKS): {err}") from err
    return path


def _try_lock(pool: Path, count: int) -> int | None:
    """Lock the first free ``gpu<i>.lock`` (its descriptor never closed) and return i; None when all are held."""
    for index in range(count):
        fd = os.open(pool / f"gpu{index}.lock", os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return index
    return None


def claim_gpu() -> int | None:
    """Claim a free GPU, set ``CUDA_VISIBLE_DEVICES`` to it and return its index (None: fewer than 2 GPUs, or one
    already chosen); :class:`KdpipeError` when none frees up within ``KDPIPE_GPU_WAIT_S``."""
    device = os.environ.get("KDPIPE_DEVICE", "").strip() or "auto"
    if "CUDA_VISIBLE_DEVICES" in os.environ or device not in ("auto", "cuda"):  # (a GPU chosen already, or none used)
        return None
    count = gpu_count()
    if count < 2:
        return None
    pool = pool_dir()
    wait_s = _env_number("KDPIPE_GPU_WAIT_S", DEFAULT_WAIT_S)
    deadline = time.monotonic() + wait_s
    index = _try_lock(pool, count)
    if index is None:
        print(
            f"kdpipe: all {count} GPUs are taken by other kdpipe jobs (locks in {pool}); "
            f"waiting up to {wait_s:g} s for one",
            file=sys.stderr,
            flush=True,
        )
    while index is None and time.monotonic() < deadline:
        time.sleep(min(POLL_S, max(deadline - time.monotonic(), 0)))
        index = _try_lock(pool, count)
    if index is None:
        raise KdpipeError(
            f"no free GPU after {wait_s:g} s: all {count} GPUs are held by other kdpipe jobs (lock files in "
            f"{pool} hold their pids); run snakemake with --resources gpu=N, N at most {count}, or raise "
            f"KDPIPE_GPU_WAIT_S"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = str(index)
    return index
