"""MUKI, Model Uncertainty-aware Knowledge Integration (docs/methods.md §1):

    L = (1/B) Σ_i m_i · KL(q_i ‖ softmax(z_s,i / τ)),   no T² factor, no gold labels

q aggregates the teachers' zero-padded distributions softmax(z_k / τ) by the scores of the student's route, hard or
soft, and m is the margin between the two best scores; both are computed once for every train row.
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.methods.base import DistillContext, Objective, student_logits
from kdpipe.methods.losses import soft_kl

MARGIN_EPS = 1e-6


def padded_probs(
    teacher_logits: list[torch.Tensor],
    blocks: list[torch.Tensor],
    num_labels: int,
    temperature: float,
    calibration: list[float] | None = None,
) -> torch.Tensor:
    """p̃_k = softmax(z_k/(τ·T_k)) scattered to the teacher's block of the student's labels, zero elsewhere:
    [N, K, C]; T_k = 1 unless the teachers are calibrated."""
    first = teacher_logits[0]
    out = first.new_zeros(first.shape[0], len(teacher_logits), num_labels, dtype=torch.float32)
    for k, (z, block) in enumerate(zip(teacher_logits, blocks)):
        t = temperature if calibration is None else temperature * calibration[k]
        out[:, k, block] = F.softmax(z.float() / t, -1)
    return out


def aggregate(
    padded: torch.Tensor, scores: torch.Tensor, mode: str, tau_s: float, weighting: str = "softmax"
) -> torch.Tensor:
    """The target q [N, C] from padded teacher distributions [N, K, C] and scores [N, K] (docs/methods.md §1):
    hard picks the best-scored teacher; soft weighs them by softmax(s/τ_s), or by the scores (weighting "scores")."""
    if mode == "hard":
        best = scores.argmax(-1)  # ties go to the first teacher
        return padded[torch.arange(padded.shape[0], device=padded.device), best]
    weights = F.softmax(scores.float() / tau_s, -1) if weighting == "softmax" else scores.float()
    return torch.einsum("nk,nkc->nc", weights, padded)


def margin_weights(scores: torch.Tensor) -> torch.Tensor:
    """m = |u_(1) − u_(2)| + 1e−6 per row from scores [N, K]; 1 for a single teacher (no second score)."""
    if scores.shape[-1] < 2:
        return scores.new_ones(scores.shape[0], dtype=torch.float32)
    top = scores.float().topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).abs() + MARGIN_EPS


def muki_loss(student: torch.Tensor, q: torch.Tensor, m: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """(1/B) Σ_i m_i · KL(q_i ‖ softmax(z_s,i/τ)); a plain batch mean when ``m`` is None. No T² factor."""
    kl = soft_kl(q, student, temperature)
    return (kl if m is None else m * kl).mean()


def build(ctx: DistillContext, args: Args) -> Objective:
    """The MUKI objective from the student's route: q and m precomputed for all train rows."""
    if ctx.route is None:
        raise KdpipeError("muki: the student has no route (the distill stage takes it with --route)")
    mode, tau_s, temperature = args.aggregation, float(args.tau_s), float(args.temperature)
    scores = ctx.route["scores"]
    calibration = ctx.route.get("temperatures")
    padded = padded_probs(
        [ctx.signal(t, "logits") for t in ctx.teachers],
        [ctx.block(t) for t in ctx.teachers],
        len(ctx.labels),
        temperature,
        None if calibration is None else [calibration[t] for t in ctx.teachers],
    )
    q = aggregate(padded, scores.to(padded.device), mode, tau_s, ctx.route.get("weighting", "softmax"))
    m = margin_weights(scores).to(q.device) if bool(args.margin) else None
    if ctx.train_labels is not None and (ctx.train_labels >= 0).any():
        labelled = ctx.train_labels >= 0
        gold = torch.from_numpy(ctx.train_labels[labelled])  # boolean indexing copies: a writable array
        right = (q.argmax(-1).cpu()[torch.from_numpy(labelled)] == gold).float().mean().item()
        print(
            f"[kdpipe] muki: the target's argmax is the gold class on {right:.1%} of labelled train rows",
            file=sys.stderr,
        )

    def loss(model, batch):
        index = batch["index"]
        kd = muki_loss(student_logits(model, batch), q[index], None if m is None else m[index], temperature)
        return kd, {"kd": kd.item()}

    return Objective(loss=loss)
