"""The no-teacher baseline (docs/methods.md §0): the student trained on the gold labels alone,

    L = CE(z_s, y)   (with label smoothing ε when set),

on the same data, architecture, initialisation and schedule as the distilled students, so that the gap between the
two is what the teachers add.
"""

from __future__ import annotations

import torch.nn.functional as F

from kdpipe.core.settings import Args
from kdpipe.methods.base import DistillContext, Objective, student_logits


def build(ctx: DistillContext, args: Args) -> Objective:
    smoothing = float(args.label_smoothing)

    def loss(model, batch):
        ce = F.cross_entropy(student_logits(model, batch).float(), batch["labels"], label_smoothing=smoothing)
        return ce, {"ce": ce.item()}

    return Objective(loss=loss)
