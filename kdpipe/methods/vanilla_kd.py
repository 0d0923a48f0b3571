"""Vanilla KD, MUKI's VKD baseline (docs/methods.md §1):

    L = T² · KL(softmax([z_1; …; z_K] / T) ‖ softmax(z_s / T)) + w_hl · CE(z_s, y)

The softmax is taken over the concatenated raw teacher logits, each teacher's block placed at its classes'
positions in the student's label order. Teachers must have disjoint class subsets; a single teacher is the usual
Hinton KD. Teachers that all cover the same full label set are averaged in logit space instead (the common
multi-teacher convention), since concatenating them is undefined. ``hard_label_weight`` (default 0) adds the gold
CE; the MUKI default temperature is 5.
"""

from __future__ import annotations

from kdpipe.methods.base import DistillContext, Objective, student_logits
from kdpipe.methods.losses import gold_cross_entropy, union_logits, vanilla_kd_loss

# method_args arrive complete: declared, checked and defaulted in kdpipe.methods.registry when the DAG is built


def build(ctx: DistillContext, args: dict) -> Objective:
    temperature, w_hl = float(args["temperature"]), float(args["hard_label_weight"])
    targets = union_logits(
        [ctx.signal(t, "logits") for t in ctx.teachers], [ctx.block(t) for t in ctx.teachers], len(ctx.labels)
    )

    def loss(model, batch):
        z = student_logits(model, batch)
        kd = vanilla_kd_loss(z, targets[batch["index"]], temperature)
        total = kd
        terms = {"kd": kd.item()}
        if w_hl:
            ce = gold_cross_entropy(z, batch["labels"])
            total = total + w_hl * ce
            terms["ce"] = ce.item()
        return total, terms

    return Objective(loss=loss)
