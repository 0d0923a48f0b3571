"""Meta-KD's student (Pan et al., ACL-IJCNLP 2021; docs/methods.md §4), distilled in two stages
from a meta-teacher's cached signals (``objective: meta``, ``kdpipe.methods.meta_kd.teacher``). Two distill jobs:
``<student>.stage1`` (method ``meta_kd_stage1``) matches intermediate features, each example weighted by its own
λ_i, then ``<student>`` (method ``meta_kd``), started from stage 1's weights, matches the soft labels at T; so a
change to stage 2 reruns stage 2 only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import model_inputs
from kdpipe.methods.base import DistillContext, Objective, student_logits
from kdpipe.methods.losses import token_mse, union_logits
from kdpipe.methods.meta_kd.branch import DomainBranch


def example_weights(prototype_scores: torch.Tensor, expertise: torch.Tensor) -> torch.Tensor:
    """λ_i = (1 + t_i)·w_i (§4), shape [B]."""
    return (1 + prototype_scores) * expertise


def attention_mse(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-example mean of (A_s − A_t)² over the heads and the (query, key) pairs of real tokens (``mask`` [B, S]).
    Shapes [B, heads, S, S] or head-averaged [B, S, S]; result [B]."""
    square = mask[:, :, None] * mask[:, None, :]
    heads = 1
    if student.dim() == 4:
        heads, square = student.shape[1], square[:, None]
    diff = (student.float() - teacher.float()) ** 2 * square
    return diff.flatten(1).sum(-1) / (square.flatten(1).sum(-1) * heads).clamp_min(1)


def stage1_loss(
    attention: torch.Tensor, hidden: torch.Tensor, domain: torch.Tensor, weights: torch.Tensor, gamma: float
) -> torch.Tensor:
    """L₁ = (1/B) Σ_i λ_i [att_i + hid_i + γ·dom_i] from the per-example terms, all shape [B]."""
    return (weights * (attention + hidden + gamma * domain)).mean()


def soft_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """L₂ = (1/B) Σ_i −Σ_c softmax(z_t/T)_c log softmax(z_s/T)_c (§4 stage 2)."""
    target = F.softmax(teacher.float() / temperature, -1)
    return -(target * F.log_softmax(student.float() / temperature, -1)).sum(-1).mean()


def _one_teacher(ctx: DistillContext, method: str) -> str:
    if len(ctx.teachers) != 1:
        raise KdpipeError(f"{method}: distils one meta-teacher, got teachers {ctx.teachers}")
    return ctx.teachers[0]


class StageOneAdapters(nn.Module):
    """What stage 1 trains besides the student: W_f (fit_dense) and the student's domain branch."""

    def __init__(self, student_width: int, teacher_width: int, domains: list[str]):
        super().__init__()
        self.fit_dense = nn.Linear(student_width, teacher_width) if student_width != teacher_width else nn.Identity()
        self.branch = DomainBranch(student_width, domains, classify=False)


def build_stage1(ctx: DistillContext, args: Args) -> Objective:
    """``meta_kd_stage1``: λ_i-weighted attention, hidden-state and domain-representation matching."""
    teacher = _one_teacher(ctx, "meta_kd")
    if not ctx.alignment or ctx.prototype_scores is None or ctx.domain_ids is None:
        raise KdpipeError("meta_kd stage 1: needs a planned layer alignment, prototype scores and domains")
    for feature in ("hidden", "attentions"):
        ctx.check_token_aligned("meta_kd", feature)
    pairs = ctx.alignment[teacher]
    hidden_pairs = [(s, ctx.hidden_slot(teacher, tl)) for s, tl in pairs]
    attention_pairs = [(s, ctx.hidden_slot(teacher, tl, "attentions")) for s, tl in pairs if s >= 1]
    teacher_heads = ctx.signal(teacher, "attentions").heads  # None: averaged over heads
    per_head = teacher_heads is not None
    student_heads = ctx.student_config.num_attention_heads
    if per_head and teacher_heads != student_heads:
        raise KdpipeError(
            f"meta_kd: the teacher's attentions have {teacher_heads} "
            f"heads, the student {student_heads}: use attention_heads: mean (or auto)"
        )
    teacher_width = ctx.signal(teacher, "hidden").hidden_size
    adapters = StageOneAdapters(ctx.student_config.hidden_size, teacher_width, ctx.domains).to(ctx.device)
    domain_rep = ctx.signal(teacher, "domain")
    weights_of = example_weights(ctx.prototype_scores, ctx.signal(teacher, "expertise"))
    gamma = float(args.gamma)

    def loss(model, batch):
        out = model(**model_inputs(batch), output_hidden_states=True, output_attentions=True)
        mask = batch["attention_mask"].float()
        index, width = batch["index"].cpu().numpy(), mask.shape[1]
        attention = sum(
            attention_mse(
                out.attentions[s - 1] if per_head else out.attentions[s - 1].mean(1),
                ctx.teacher_feature(teacher, "attentions", slot, index, width),
                mask,
            )
            for s, slot in attention_pairs
        )
        hidden = sum(
            token_mse(
                adapters.fit_dense(out.hidden_states[s].float()),
                ctx.teacher_feature(teacher, "hidden", slot, index, width),
                mask,
            )
            for s, slot in hidden_pairs
        )
        g_s = adapters.branch.representation(out.hidden_states[-1], mask, ctx.domain_ids[batch["index"]])
        g_t = torch.from_numpy(domain_rep[index].astype("float32")).to(ctx.device)
        domain = ((adapters.fit_dense(g_s) - g_t) ** 2).mean(-1)
        weights = weights_of[batch["index"]]
        total = stage1_loss(attention, hidden, domain, weights, gamma)
        return total, {
            "attention": attention.mean().item(),
            "hidden": hidden.mean().item(),
            "domain": domain.mean().item(),
            "lambda": weights.mean().item(),
        }

    return Objective(loss=loss, extra_modules={"meta_kd_adapters": (adapters, None)}, validates=False)


def build(ctx: DistillContext, args: Args) -> Objective:
    """``meta_kd`` (stage 2, from the stage-1 weights): soft cross-entropy to the teacher's logits at T."""
    teacher = _one_teacher(ctx, "meta_kd")
    targets = union_logits([ctx.signal(teacher, "logits")], [ctx.block(teacher)], len(ctx.labels))
    temperature = float(args.temperature)

    def loss(model, batch):
        kd = soft_cross_entropy(student_logits(model, batch), targets[batch["index"]], temperature)
        return kd, {"kd": kd.item()}

    return Objective(loss=loss)
