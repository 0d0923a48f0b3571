"""Loss building blocks shared by the methods (pure tensor functions, docs/methods.md notation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kdpipe.core.store import KdpipeError


def kl_divergence(target: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """Per-example KL(target ‖ p) = Σ_c target_c (log target_c − log p_c), with 0·log 0 = 0. Shape [B]."""
    return (torch.special.xlogy(target, target) - target * log_probs).sum(-1)


def soft_kl(target: torch.Tensor, student_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Per-example KL(target ‖ softmax(z_s / T)), with no T² factor. Shape [B]."""
    return kl_divergence(target, F.log_softmax(student_logits.float() / temperature, -1))


def token_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean over the real tokens (``mask`` [B, S]) and the feature dimension of (a − b)², for token-level
    states [B, S, H]. Shape [B]."""
    per_token = ((a.float() - b.float()) ** 2).mean(-1) * mask
    return per_token.sum(-1) / mask.sum(-1).clamp_min(1)


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
    raise KdpipeError(
        "vanilla_kd: teachers must have disjoint class subsets or all cover the full label set "
        f"(class counts {sizes} for {num_labels} labels)"
    )


def vanilla_kd_loss(student: torch.Tensor, teacher_union: torch.Tensor, temperature: float) -> torch.Tensor:
    """T²·KL(softmax(z_t/T) ‖ softmax(z_s/T)), batch mean."""
    target = F.softmax(teacher_union.float() / temperature, -1)
    return temperature**2 * soft_kl(target, student, temperature).mean()


def gold_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, *, label_smoothing: float = 0.0) -> torch.Tensor:
    """Cross-entropy with the gold labels, averaged over the whole batch, a row without a gold label (``NO_LABEL``)
    adding 0, not NaN (docs/methods.md, "Rows without a gold label")."""
    labelled = labels >= 0
    per_row = F.cross_entropy(logits.float(), labels.clamp_min(0), reduction="none", label_smoothing=label_smoothing)
    return (per_row * labelled).sum() / max(len(labels), 1)


def weighted_gold_ce(logits: torch.Tensor, batch: dict, weight: float) -> tuple[torch.Tensor, dict]:
    """(``weight`` · :func:`gold_cross_entropy`, its ``ce`` term); with weight 0 the batch's labels are not read
    (docs/report.md, "Which gold labels each model read")."""
    if not weight:
        return logits.new_zeros((), dtype=torch.float32), {}
    ce = gold_cross_entropy(logits, batch["labels"])
    return weight * ce, {"ce": ce.item()}
