"""Vanilla KD, MUKI's VKD baseline (docs/methods.md §1):

    L = T² · KL(softmax([z_1; …; z_K] / T) ‖ softmax(z_s / T)) + w_hl · CE(z_s, y)

The teachers' logits are placed at their classes' positions in the student's label order (disjoint subsets
concatenated; teachers of one full label set averaged in logit space).
"""

from __future__ import annotations

from kdpipe.core.settings import Args
from kdpipe.methods.base import DistillContext, Objective, student_logits
from kdpipe.methods.losses import union_logits, vanilla_kd_loss, weighted_gold_ce


def build(ctx: DistillContext, args: Args) -> Objective:
    temperature, w_hl = float(args.temperature), float(args.hard_label_weight)
    targets = union_logits(
        [ctx.signal(t, "logits") for t in ctx.teachers], [ctx.block(t) for t in ctx.teachers], len(ctx.labels)
    )

    def loss(model, batch):
        z = student_logits(model, batch)
        kd = vanilla_kd_loss(z, targets[batch["index"]], temperature)
        ce, ce_terms = weighted_gold_ce(z, batch, w_hl)
        return kd + ce, {"kd": kd.item(), **ce_terms}

    return Objective(loss=loss)
