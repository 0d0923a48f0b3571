"""Data-parallel training over several processes (docs/cluster.md, "One job on several devices").

A job started with ``--processes N`` runs as N processes under ``torchrun``; each takes every N-th row of each
global batch, and the gradients are summed before the optimiser step: the one-process update. Rank 0 alone writes.
Without a process group every function here is the one-process identity. Not ``DistributedDataParallel``, which
wraps one module: kdpipe's losses call the model and their own modules directly, and one all-reduce of the flattened
gradients after ``backward`` serves any set of modules.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys

import numpy as np
import torch
import torch.distributed as dist

# This process's share of the current global batch's rows (set by the loop each step, read by sync_backward)
_SHARE = 1.0
# Where collectives put their tensors (NCCL needs them on the GPU)
_DEVICE = torch.device("cpu")


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def is_main() -> bool:
    """Whether this process writes (rank 0, or the only process)."""
    return rank() == 0


def init(device: torch.device) -> None:
    """Join the process group torchrun describes (nothing for a single process); a rank dies with its launcher
    (``PR_SET_PDEATHSIG``), so a job killed with SIGKILL leaves no orphan rank training into its resume folder."""
    if int(os.environ.get("WORLD_SIZE") or 1) <= 1 or dist.is_initialized():  # (torchrun's number of processes)
        return
    global _DEVICE
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc: the rank may outlive a killed launcher
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    _DEVICE = device
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")


def close() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def shard(batch: np.ndarray) -> tuple[np.ndarray, float]:
    """This process's rows of a global batch (dealt round-robin: the batch is sorted by length, so each gets alike
    lengths) and their share of it. A process left without a row
    takes the batch's first row with share 0, so that every process runs the same collectives."""
    world = world_size()
    if world == 1:
        return batch, 1.0
    part = batch[rank() :: world]
    if len(part) == 0:
        return batch[:1], 0.0
    return part, len(part) / len(batch)


def set_share(share: float) -> None:
    global _SHARE
    _SHARE = share


def sync_backward(loss: torch.Tensor, params: list[torch.nn.Parameter]) -> float:
    """``loss.backward()`` for this process's rows (``loss``: their mean), then the gradients of ``params`` (the same
    list, in the same order, everywhere) summed over the processes; returns the global batch's mean loss."""
    if world_size() == 1:
        loss.backward()
        return loss.item()
    (loss * _SHARE).backward()
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    present = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=loss.device)
    flat = torch.cat([g.reshape(-1).float() for g in grads] + [present, (loss.detach() * _SHARE).reshape(1).float()])
    dist.all_reduce(flat)
    offset = 0
    for p, g in zip(params, grads):
        count = g.numel()
        p.grad = flat[offset : offset + count].view_as(g).to(g.dtype)
        offset += count
    for p, seen in zip(params, flat[offset : offset + len(params)].tolist()):
        if seen == 0:  # no process computed a gradient for it: leave it out of the step, as one process would
            p.grad = None
    return float(flat[-1])


def mean(value: float) -> float:
    """The mean of a per-process value, each weighted by its share of the global batch (e.g. a loss term)."""
    if world_size() == 1:
        return value
    total = torch.tensor([value * _SHARE], dtype=torch.float64, device=_DEVICE)
    dist.all_reduce(total)
    return float(total)


def broadcast(obj):
    """Rank 0's ``obj`` in every process (e.g. validation metrics, so every process keeps the same best epoch)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather(obj) -> list:
    """Every process's ``obj``, by rank (e.g. the random-number states a checkpoint keeps)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def same_start(modules: list[torch.nn.Module]) -> None:
    """Rank 0's weights in every process, before the first step (random initialisations may differ)."""
    if world_size() == 1:
        return
    with torch.no_grad():
        for module in modules:
            for tensor in module.state_dict().values():
                dist.broadcast(tensor, src=0)


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()
