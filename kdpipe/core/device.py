"""Device and precision choices (docs/design.md, "Compute").

The device is read from ``KDPIPE_DEVICE`` (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``), not the config: it is part of
no result's identity, so moving a workflow to a GPU reruns nothing.
"""

from __future__ import annotations

import contextlib
import os

import torch


def pick_device(requested: str | None = None) -> torch.device:
    """``auto`` picks CUDA when present, else CPU; a rank of a ``torchrun`` job that sees several GPUs takes the one
    of its local rank."""
    choice = (requested or os.environ.get("KDPIPE_DEVICE") or "auto").strip()
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and "LOCAL_RANK" in os.environ and torch.cuda.device_count() > 1:
        return torch.device(f"cuda:{int(os.environ['LOCAL_RANK']) % torch.cuda.device_count()}")
    return torch.device(choice)


def autocast(device: torch.device):
    """bf16 autocast on CUDA where supported; plain fp32 elsewhere (bf16 on these CPUs is 7-23x slower)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def set_threads(threads: int | None) -> None:
    """Use the threads Snakemake granted the job, so parallel jobs do not oversubscribe the cores."""
    if threads:
        torch.set_num_threads(int(threads))
