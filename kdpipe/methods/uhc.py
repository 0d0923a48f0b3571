"""UHC, MUKI's block-renormalised baseline (docs/methods.md §1):

    L = T² · Σ_k KL(softmax(z_k / T) ‖ q_s[block k] / Σ q_s[block k]),   q_s = softmax(z_s / T)

Each teacher k covers a disjoint block of the student's classes; the student's distribution is renormalised inside
that block and matched to the teacher's local distribution. Batch mean over examples; no gold labels; default T = 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kdpipe.core.settings import Args
from kdpipe.methods.base import DistillContext, Objective, student_logits
from kdpipe.methods.losses import kl_divergence


def block_renormalised_log_probs(student: torch.Tensor, block: torch.Tensor, temperature: float) -> torch.Tensor:
    """log(q_s[block] / Σ q_s[block]) with q_s = softmax(z_s / T), shape [B, len(block)], in the block's order:
    exactly ``log_softmax(z_s[:, block] / T)`` (the other classes' mass cancels), stable for large logits."""
    return F.log_softmax(student[:, block].float() / temperature, -1)


def uhc_loss(
    student: torch.Tensor, teacher_logits: list[torch.Tensor], blocks: list[torch.Tensor], temperature: float
) -> torch.Tensor:
    """T² · Σ_k KL(softmax(z_k/T) ‖ renormalised student block k), batch mean (docs/methods.md §1, UHC)."""
    total = student.new_zeros((), dtype=torch.float32)
    for z_k, block in zip(teacher_logits, blocks):
        target = F.softmax(z_k.float() / temperature, -1)
        total = total + kl_divergence(target, block_renormalised_log_probs(student, block, temperature)).mean()
    return temperature**2 * total


def build(ctx: DistillContext, args: Args) -> Objective:
    temperature = float(args.temperature)
    logits = [ctx.signal(t, "logits") for t in ctx.teachers]
    blocks = [ctx.block(t) for t in ctx.teachers]

    def loss(model, batch):
        index = batch["index"]
        kd = uhc_loss(student_logits(model, batch), [z[index] for z in logits], blocks, temperature)
        return kd, {"kd": kd.item()}

    return Objective(loss=loss)
