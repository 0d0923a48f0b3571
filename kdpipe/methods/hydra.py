"""Hydra and Hydra+ (docs/methods.md §3): distil an N-member ensemble into a shared core with M heads.

L = (1−α)·L1 + α[(1−β)·L2 + β·L3] + λ·L4: the heads' CE, the KL of the mean predictions, each head's KL to its
members (head m matched to members m, m+M, …) and the heads' weight diversity, λ following :func:`lambda_at`.
Plain Hydra (:func:`build_hydra`) is α = 1, β = 1, λ = 0. The student is a multi-head model
(``kdpipe.models.multihead``) with M ≤ N heads; the members are full-label teachers (both checked by the plan).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import model_inputs
from kdpipe.methods.base import DistillContext, Objective
from kdpipe.methods.losses import gold_cross_entropy, kl_divergence
from kdpipe.models.multihead import MultiHeadClassifier, mean_probs_log

# plain Hydra: β = 1 gives the aggregate KL weight 0, so its temperature is fixed too (it has no effect)
HYDRA_FIXED = {"alpha": 1.0, "beta": 1.0, "diversity": 0.0, "diversity_ramp": None, "temp_aggregate": 1.0}

COSINE_EPS = 1e-8


def correctness_loss(head_logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """L1 = (1/M) Σ_m CE(s_m, y), batch mean (a row without a gold label adds 0). ``head_logits`` [M, B, C],
    ``y`` [B]."""
    m, _, c = head_logits.shape
    return gold_cross_entropy(head_logits.reshape(-1, c), y.repeat(m))


def aggregation_loss(member_logits: torch.Tensor, head_logits: torch.Tensor, temp: float) -> torch.Tensor:
    """L2 = T_a²·KL(mean_n softmax(t_n/T_a) ‖ mean_m softmax(s_m/T_a)), batch mean. Logits [N|M, B, C]."""
    target = F.softmax(member_logits.float() / temp, -1).mean(0)
    return temp**2 * kl_divergence(target, mean_probs_log(head_logits.float() / temp)).mean()


def individuality_loss(member_logits: torch.Tensor, head_logits: torch.Tensor, temp: float) -> torch.Tensor:
    """L3 = (T_i²/max(N,M)) Σ_{j<max(N,M)} KL(softmax(t_{j mod N}/T_i) ‖ softmax(s_{j mod M}/T_i)), batch mean."""
    n, m = member_logits.shape[0], head_logits.shape[0]
    pairs = torch.arange(max(n, m), device=head_logits.device)
    targets = F.softmax(member_logits[pairs % n].float() / temp, -1)
    kl = kl_divergence(targets, F.log_softmax(head_logits[pairs % m].float() / temp, -1))  # [max(N,M), B]
    return temp**2 * kl.sum(0).mean() / len(pairs)


def _agreement(mean: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Σ_m Σ_rows (1 + cos(mean_row, w^m_row))/2 for stacked ``weights`` [M, rows, ...]; 1-D parameters ([M, n])
    elementwise as (1 + sign(mean·w))/2."""
    if weights.ndim == 2:
        return ((1 + torch.sign(mean * weights)) / 2).sum()
    flat, mean = weights.flatten(2), mean.flatten(1)
    dot = (flat * mean).sum(-1)
    cos = dot / (flat.norm(dim=-1) * mean.norm(dim=-1)).clamp_min(COSINE_EPS)
    return ((1 + cos) / 2).sum()


def diversity_loss(head_linears: list[list[nn.Linear]]) -> torch.Tensor:
    """L4 = Σ_layers Σ_m Σ_rows (1 + cos(θ̄^l_row, θ^{l,m}_row))/2 over every Linear weight and bias of the heads;
    ``head_linears[m]`` lists head m's Linear modules, in the same order for every head (docs/methods.md §3)."""
    if len({len(linears) for linears in head_linears}) != 1:
        raise KdpipeError("diversity loss: the heads have different numbers of Linear layers")
    total = head_linears[0][0].weight.new_zeros(())
    for layer in zip(*head_linears):
        for name in ("weight", "bias"):
            params = [getattr(linear, name) for linear in layer]
            if params[0] is not None:
                stacked = torch.stack([p.float() for p in params])
                total = total + _agreement(stacked.mean(0), stacked)
    return total


def lambda_at(epoch: int, lam: float, ramp: list | tuple | None) -> float:
    """λ for 0-based ``epoch``: ``lam`` when ``ramp`` is None, else 0 up to epoch ramp[0], rising linearly to
    ``lam`` at epoch ramp[1] and constant after (docs/methods.md §3, CIFAR-10: 0 → λ over epochs 20 → 150)."""
    if ramp is None:
        return float(lam)
    if len(ramp) != 2 or not 0 <= ramp[0] < ramp[1]:
        raise KdpipeError(f"hydra_plus: diversity_ramp must be [start, end] epochs with 0 ≤ start < end, got {ramp}")
    start, end = ramp
    return float(lam) * min(max((epoch - start) / (end - start), 0.0), 1.0)


def build(ctx: DistillContext, args: Args) -> Objective:
    """Hydra+ (docs/methods.md §3): L = (1−α)·L1 + α[(1−β)·L2 + β·L3] + λ·L4, λ set per epoch by ``on_epoch``."""
    for name in ("alpha", "beta"):
        if not 0 <= float(getattr(args, name)) <= 1:
            raise KdpipeError(f"hydra_plus: {name} must lie in [0, 1], got {getattr(args, name)}")
    for name in ("temp_aggregate", "temp_individual"):
        if not float(getattr(args, name)) > 0:
            raise KdpipeError(f"hydra_plus: {name} must be positive, got {getattr(args, name)}")
    if not float(args.diversity) >= 0:
        raise KdpipeError(f"hydra_plus: diversity must be non-negative, got {args.diversity}")
    alpha, beta = float(args.alpha), float(args.beta)
    temp_a, temp_i = float(args.temp_aggregate), float(args.temp_individual)
    lam, ramp = float(args.diversity), args.diversity_ramp
    members = torch.stack([ctx.full_label_logits(t) for t in ctx.teachers])  # [N, rows, C]
    state = {"lambda": lambda_at(0, lam, ramp)}  # (a bad ramp fails here, before training)

    def on_epoch(epoch: int, epochs: int) -> None:
        state["lambda"] = lambda_at(epoch, lam, ramp)

    def loss(model: MultiHeadClassifier, batch: dict):
        heads = model(**model_inputs(batch)).head_logits
        targets = members[:, batch["index"]]
        # α = 1 (plain Hydra) gives L1 no weight: the gold labels are then not read
        l1 = correctness_loss(heads, batch["labels"]) if alpha < 1 else None
        l2 = aggregation_loss(targets, heads, temp_a)
        l3 = individuality_loss(targets, heads, temp_i)
        weight = state["lambda"]
        with torch.set_grad_enabled(weight > 0 and torch.is_grad_enabled()):
            l4 = diversity_loss(model.head_linears())
        total = alpha * ((1 - beta) * l2 + beta * l3) + weight * l4
        if l1 is not None:
            total = total + (1 - alpha) * l1
        return total, {
            **({"ce": l1.item()} if l1 is not None else {}),
            "aggregate": l2.item(),
            "individual": l3.item(),
            "diversity": l4.item(),
            "lambda": weight,
        }

    return Objective(loss=loss, on_epoch=on_epoch)


def build_hydra(ctx: DistillContext, args: Args) -> Objective:
    """Plain Hydra (docs/methods.md §3): α = 1, β = 1, λ = 0, i.e. L3 only; only ``temp_individual`` may be set."""
    return build(ctx, Args({**args.to_dict(), **HYDRA_FIXED}, "method_args"))
