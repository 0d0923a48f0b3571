"""Dynamic KD (Li et al., EMNLP 2021; docs/methods.md §2): the student's own uncertainty steers KD.

One builder per variant. The student's normalised entropy ĥ is computed online every step (detached unless
``entropy_grad: true``); the teacher side is read from the cache.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import model_inputs
from kdpipe.methods.base import DistillContext, Objective, student_logits
from kdpipe.methods.dynamic_choices import REVERSED
from kdpipe.methods.losses import soft_kl, token_mse, union_logits, weighted_gold_ce


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """H(softmax(z_i)) in nats from the logits, differentiable; shape [B] (docs/methods.md §2)."""
    log_p = F.log_softmax(logits.float(), -1)
    return -(log_p.exp() * log_p).sum(-1)


def normalized_entropy(logits: torch.Tensor) -> torch.Tensor:
    """ĥ_i = H(softmax(z_i)) / log C, in [0, 1], differentiable; shape [B] (docs/methods.md §2)."""
    return entropy(logits) / math.log(logits.shape[-1])


def kd_distance(student: torch.Tensor, teacher: torch.Tensor, distance: str, temperature: float) -> torch.Tensor:
    """Per-example KD distance D_i: ``mse`` mean_c (z_s − z_t)², or ``kl`` T²·KL(softmax(z_t/T) ‖ softmax(z_s/T))."""
    if distance == "mse":
        return ((student.float() - teacher.float()) ** 2).mean(-1)
    target = F.softmax(teacher.float() / temperature, -1)
    return temperature**2 * soft_kl(target, student, temperature)


def teacher_weights(
    h: torch.Tensor, mode: str, direction: str = "uncertain_to_small"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-example weights (w_small, w_large), shape [B] each, such that the KD term is
    mean_i(w_small,i·D_small,i + w_large,i·D_large,i) (docs/methods.md §2a)."""
    if mode == "hard":  # the ⌊B/2⌋ most uncertain rows and the others each contribute their own mean
        b = h.shape[0]
        half = b // 2
        uncertain = torch.zeros_like(h, dtype=torch.bool)
        uncertain[torch.argsort(h.detach(), descending=True, stable=True)[:half]] = True
        to_uncertain = uncertain.float() * (b / half if half else 0.0)
        to_certain = (~uncertain).float() * (b / (b - half))
    elif mode == "soft":
        to_uncertain = h.mean().expand_as(h)
        to_certain = 1 - to_uncertain
    else:  # soft_instance
        to_uncertain, to_certain = h, 1 - h
    if direction == "uncertain_to_small":
        return to_uncertain, to_certain
    return to_certain, to_uncertain


def selection_scores(logits: torch.Tensor, strategy: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """Scores of the examples, highest = most informative = kept first (docs/methods.md §2b). Shape [B], no gradient."""
    base, reverse = strategy.removesuffix(REVERSED), strategy.endswith(REVERSED)
    p = F.softmax(logits.detach().float(), -1)
    if base == "entropy":
        scores = entropy(logits.detach())
    elif base == "margin":
        top2 = p.topk(2, dim=-1).values
        scores = -(top2[:, 0] - top2[:, 1])
    elif base == "confidence":
        scores = -p.max(-1).values
    else:  # random
        scores = torch.rand(p.shape[0], generator=generator).to(p.device)
    return -scores if reverse else scores


def select_top(scores: torch.Tensor, ratio: float) -> torch.Tensor:
    """Indices of the ⌊r·B⌋ highest-scoring examples (ties: the earlier example first)."""
    if not 0 < ratio <= 1:
        raise KdpipeError(f"dynamic_data: ratio must be in (0, 1], not {ratio}")
    keep = math.floor(ratio * scores.shape[0] + 1e-9)
    return torch.argsort(scores, descending=True, stable=True)[:keep]


def normalized_hidden_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean over real tokens and dims of (n(h_s) − n(h_t))², n = L2-normalisation over the hidden
    dimension. Shapes [B, S, H], [B, S, H], mask [B, S]; result [B]."""
    return token_mse(F.normalize(student.float(), dim=-1), F.normalize(teacher.float(), dim=-1), mask)


def objective_weights(h: torch.Tensor, strategy: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit weight, hidden weight) per example: (1 − ĥ, ĥ), swapped for ``uncertainty-r``, (1, 1) for ``none``."""
    if strategy == "uncertainty":
        return 1 - h, h
    if strategy == "uncertainty-r":
        return h, 1 - h
    return torch.ones_like(h), torch.ones_like(h)


def build_teacher(ctx: DistillContext, args: Args) -> Objective:
    """``dynamic_teacher``: CE + KD from a small and a large teacher, weighted by the student's ĥ (§2a)."""
    if len(ctx.teachers) != 2 or args.small_teacher not in ctx.teachers:
        raise KdpipeError(
            f"dynamic_teacher: needs exactly two teachers and method_args.small_teacher naming the "
            f"smaller one; teachers are {ctx.teachers}, small_teacher is {args.small_teacher!r}"
        )
    large = next(t for t in ctx.teachers if t != args.small_teacher)
    small_z, large_z = ctx.full_label_logits(args.small_teacher), ctx.full_label_logits(large)
    distance, temperature = args.distance, float(args.temperature)

    def loss(model, batch):
        z = student_logits(model, batch)
        ce, ce_terms = weighted_gold_ce(z, batch, args.ce_weight)
        h = normalized_entropy(z if args.entropy_grad else z.detach())
        w_small, w_large = teacher_weights(h, args.mode, args.direction)
        d_small = kd_distance(z, small_z[batch["index"]], distance, temperature)
        d_large = kd_distance(z, large_z[batch["index"]], distance, temperature)
        kd = (w_small * d_small + w_large * d_large).mean()
        total = ce + args.kd_weight * kd
        return total, {**ce_terms, "kd": kd.item(), "entropy": h.mean().item(), "w_small": w_small.mean().item()}

    return Objective(loss=loss)


def build_data(ctx: DistillContext, args: Args) -> Objective:
    """``dynamic_data``: CE on the whole batch + KD on the top fraction r scored by the student (§2b)."""
    ratio = float(args.ratio)
    select_top(torch.zeros(1), ratio)  # a bad ratio (which the registry does not check) fails before training
    targets = union_logits(
        [ctx.signal(t, "logits") for t in ctx.teachers], [ctx.block(t) for t in ctx.teachers], len(ctx.labels)
    )
    distance, temperature = args.distance, float(args.temperature)

    def loss(model, batch):
        z = student_logits(model, batch)
        ce, ce_terms = weighted_gold_ce(z, batch, args.ce_weight)
        kept = select_top(selection_scores(z, args.strategy), ratio)
        if len(kept):
            kd = kd_distance(z[kept], targets[batch["index"][kept]], distance, temperature).mean()
        else:
            kd = z.new_zeros((), dtype=torch.float32)
        total = ce + args.kd_weight * kd
        return total, {**ce_terms, "kd": kd.item(), "kept": float(len(kept))}

    return Objective(loss=loss)


def build_objective(ctx: DistillContext, args: Args) -> Objective:
    """``dynamic_objective``: (1 − ĥ)-weighted logit MSE + ĥ-weighted normalised hidden-state MSE (§2c)."""
    if len(ctx.teachers) != 1 or not ctx.alignment:
        raise KdpipeError(
            f"dynamic_objective: needs exactly one teacher (got {ctx.teachers}) with a planned layer alignment"
        )
    teacher = ctx.teachers[0]
    ctx.check_token_aligned("dynamic_objective")
    width = ctx.signal(teacher, "hidden").hidden_size
    if width != ctx.student_config.hidden_size:
        raise KdpipeError(
            f"dynamic_objective: teacher hidden size {width} differs from the student's "
            f"{ctx.student_config.hidden_size}; the objective compares hidden states directly"
        )
    pairs = [(s, ctx.hidden_slot(teacher, tl)) for s, tl in ctx.alignment[teacher]]
    targets = ctx.full_label_logits(teacher)
    distance, temperature = args.distance, float(args.temperature)

    def loss(model, batch):
        out = model(**model_inputs(batch), output_hidden_states=True)
        z = out.logits
        ce, ce_terms = weighted_gold_ce(z, batch, args.ce_weight)
        h = normalized_entropy(z if args.entropy_grad else z.detach())
        w_logit, w_rep = objective_weights(h, args.strategy)
        d = kd_distance(z, targets[batch["index"]], distance, temperature)
        mask = batch["attention_mask"].float()
        index, width = batch["index"].cpu().numpy(), mask.shape[1]
        r = sum(
            normalized_hidden_mse(
                out.hidden_states[s], ctx.teacher_feature(teacher, "hidden", slot, index, width), mask
            )
            for s, slot in pairs
        )
        kl, rep = (w_logit * d).mean(), (w_rep * r).mean()
        total = ce + args.kd_weight * kl + args.rep_weight * rep
        return total, {**ce_terms, "kd": kl.item(), "rep": rep.item(), "entropy": h.mean().item()}

    return Objective(loss=loss)
