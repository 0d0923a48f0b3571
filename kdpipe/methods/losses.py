"""Loss building blocks shared by the methods (pure tensor functions, METHODS.md notation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


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
