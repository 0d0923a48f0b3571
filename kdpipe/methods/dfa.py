"""DFA, MUKI's feature-amalgamation baseline (docs/methods.md §1):

    L = α_kd·L_VKD + α_rec·L_rec + α_amal·L_amal

For each layer pair (``kdpipe.models.backbones.strided_alignment``) trained adapters encode the concatenated
teacher features to r, reconstruct each teacher's features from r (L_rec) and match the student to r (L_amal).
Teacher features come from the cached dumps, so the student must tokenise like the teachers (checked);
docs/methods.md §1.3.
"""

from __future__ import annotations

import torch
from torch import nn

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import model_inputs
from kdpipe.methods.base import DistillContext, Objective
from kdpipe.methods.losses import union_logits, vanilla_kd_loss


class Amalgamator(nn.Module):
    """One encoder, decoder and student adapter per aligned layer pair."""

    def __init__(self, teacher_widths: list[int], student_width: int, pairs: int):
        super().__init__()
        total = sum(teacher_widths)
        self.widths = list(teacher_widths)
        self.encoders = nn.ModuleList(nn.Linear(total, student_width) for _ in range(pairs))
        self.decoders = nn.ModuleList(nn.Linear(student_width, total) for _ in range(pairs))
        self.adapters = nn.ModuleList(nn.Linear(student_width, student_width) for _ in range(pairs))


def masked_mse(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean squared error over the real tokens (mask [B, S]) and the feature dimension."""
    per_token = ((a - b) ** 2).mean(-1)
    return (per_token * mask).sum() / mask.sum().clamp_min(1)


def amalgamation_losses(
    amalgamator: Amalgamator,
    pair: int,
    student_hidden: torch.Tensor,
    teacher_features: list[torch.Tensor],
    mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(L_rec, L_amal) of one aligned layer pair; shapes [B, S, H_s] and K × [B, S, H_k]."""
    r = amalgamator.encoders[pair](torch.cat(teacher_features, -1))
    decoded = amalgamator.decoders[pair](r).split(amalgamator.widths, -1)
    rec = sum(masked_mse(d, f, mask) for d, f in zip(decoded, teacher_features))
    amal = masked_mse(amalgamator.adapters[pair](student_hidden), r.detach(), mask)
    return rec, amal


def build(ctx: DistillContext, args: Args) -> Objective:
    teachers, temperature = ctx.teachers, float(args.temperature)
    if not ctx.alignment:
        raise KdpipeError("dfa: no layer alignment was planned for this student")
    ctx.check_token_aligned("dfa")
    pairs = [[(s, ctx.hidden_slot(t, tl)) for s, tl in ctx.alignment[t]] for t in teachers]
    if any(len(p) != len(pairs[0]) or [s for s, _ in p] != [s for s, _ in pairs[0]] for p in pairs):
        raise KdpipeError("dfa: teachers are aligned to different student layers")
    student_layers = [s for s, _ in pairs[0]]
    widths = [ctx.signal(t, "hidden").hidden_size for t in teachers]
    amalgamator = Amalgamator(widths, ctx.student_config.hidden_size, len(student_layers)).to(ctx.device)
    targets = union_logits(
        [ctx.signal(t, "logits") for t in teachers], [ctx.block(t) for t in teachers], len(ctx.labels)
    )

    def loss(model, batch):
        out = model(**model_inputs(batch), output_hidden_states=True)
        kd = vanilla_kd_loss(out.logits, targets[batch["index"]], temperature)
        index = batch["index"].cpu().numpy()
        mask = batch["attention_mask"].float()
        width = mask.shape[1]
        rec_total = amal_total = out.logits.new_zeros(())
        for p, layer in enumerate(student_layers):
            feats = [ctx.teacher_feature(t, "hidden", pairs[i][p][1], index, width) for i, t in enumerate(teachers)]
            rec, amal = amalgamation_losses(amalgamator, p, out.hidden_states[layer].float(), feats, mask)
            rec_total, amal_total = rec_total + rec, amal_total + amal
        total = args.kd_weight * kd + args.rec_weight * rec_total + args.amal_weight * amal_total
        return total, {"kd": kd.item(), "rec": rec_total.item(), "amal": amal_total.item()}

    return Objective(loss=loss, extra_modules={"dfa_adapters": (amalgamator, float(args.adapter_lr))})
