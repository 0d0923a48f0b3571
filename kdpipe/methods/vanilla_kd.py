"""Vanilla KD, MUKI's VKD baseline (METHODS.md §1, "Baselines"):

    L = T² · KL(softmax([z_1; …; z_K] / T) ‖ softmax(z_s / T)) + w_hl · CE(z_s, y)

The softmax is taken over the concatenated raw teacher logits, each teacher's block placed at its classes'
positions in the student's label order. Teachers must have disjoint class subsets; a single teacher is the usual
Hinton KD. Teachers that all cover the same full label set are averaged in logit space instead (the common
multi-teacher convention), since concatenating them is undefined. ``hard_label_weight`` (default 0) adds the gold
CE; the MUKI default temperature is 5.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kdpipe.methods.base import Objective, DistillContext, student_logits
from kdpipe.methods.losses import soft_kl
from kdpipe.store import KdpipeError

DEFAULTS = {"temperature": 5.0, "hard_label_weight": 0.0}


def union_logits(teacher_logits: list[torch.Tensor], blocks: list[torch.Tensor], num_labels: int) -> torch.Tensor:
    """Teacher logits placed in the student's label order: scattered blocks (disjoint) or their mean (same set)."""
    sizes = [len(b) for b in blocks]
    if sum(sizes) == num_labels:
        out = teacher_logits[0].new_zeros(teacher_logits[0].shape[0], num_labels)
        for z, block in zip(teacher_logits, blocks):
            out[:, block] = z
        return out
    if all(size == num_labels for size in sizes):
        return torch.stack([z[:, torch.argsort(b)] for z, b in zip(teacher_logits, blocks)]).mean(0)
    raise KdpipeError("vanilla_kd: teachers must have disjoint class subsets or all cover the full label set "
                      f"(class counts {sizes} for {num_labels} labels)")


def vanilla_kd_loss(student: torch.Tensor, teacher_union: torch.Tensor, temperature: float) -> torch.Tensor:
    """T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)), batch mean."""
    target = F.softmax(teacher_union.float() / temperature, -1)
    return temperature ** 2 * soft_kl(target, student, temperature).mean()


def build(ctx: DistillContext, args: dict) -> Objective:
    args = {**DEFAULTS, **args}
    temperature, w_hl = float(args["temperature"]), float(args["hard_label_weight"])
    targets = union_logits([ctx.signal(t, "logits") for t in ctx.teachers],
                           [ctx.block(t) for t in ctx.teachers], len(ctx.labels))

    def loss(model, batch):
        z = student_logits(model, batch)
        kd = vanilla_kd_loss(z, targets[batch["index"]], temperature)
        total = kd
        terms = {"kd": kd.item()}
        if w_hl:
            ce = F.cross_entropy(z.float(), batch["labels"])
            total = total + w_hl * ce
            terms["ce"] = ce.item()
        return total, terms

    return Objective(loss=loss)
