"""Meta-KD's meta-teacher objective (docs/methods.md §4): ``finetune_teacher`` with
``objective: meta``.

Each example's CE is weighted by its prototype score t_i, and a domain branch (``kdpipe.methods.meta_kd.branch``)
learns the *corrupted* domain labels of a random permutation π of the batch:
L_T = (1/B) Σ_i t_i · [CE(z_i, y_i) + γ · CE(ℓ_i, d_π(i))].
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import model_inputs
from kdpipe.data.dataset import domain_ids, read_split
from kdpipe.methods.meta_kd.branch import DomainBranch, save_branch
from kdpipe.signals.io import read_prototype_scores
from kdpipe.training.loop import Objective


def meta_teacher_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    domain_logits: torch.Tensor,
    corrupted: torch.Tensor,
    weights: torch.Tensor,
    gamma: float,
):
    """(L_T, mean CE, mean domain CE): (1/B) Σ_i w_i [CE(z_i, y_i) + γ·CE(ℓ_i, corrupted_i)] (§4)."""
    ce = F.cross_entropy(logits.float(), labels, reduction="none")
    domain = F.cross_entropy(domain_logits.float(), corrupted, reduction="none")
    return (weights * (ce + gamma * domain)).mean(), ce.mean(), domain.mean()


def corrupted_domains(domains: torch.Tensor) -> torch.Tensor:
    """d_π(i): the batch's domain labels under a random permutation (the torch RNG, checkpointed by the loop)."""
    return domains[torch.randperm(len(domains)).to(domains.device)]


def build(
    model,
    train: pd.DataFrame,
    *,
    data_dir: Path,
    domains: list[str],
    prototypes: Path | None,
    device: torch.device,
    args: Args,
) -> Objective:
    """The meta-teacher's loss over ``train``, the teacher's rows, weighted by their prototype scores; the branch
    covers the dataset's ``domains``."""
    if train["domain"].nunique() < 2:
        raise KdpipeError(
            f"objective: meta needs rows of at least 2 domains; the teacher's rows are all of "
            f"{sorted(set(train['domain']))}"
        )
    weights = np.ones(len(train), dtype=np.float32)
    if args.sample_weights:
        if prototypes is None:
            raise KdpipeError("objective: meta with sample_weights needs the prototype scores (the prototypes rule)")
        full = read_split(data_dir, "train")["row_id"].to_numpy()
        by_row = pd.Series(read_prototype_scores(prototypes, full), index=full)
        weights = by_row.loc[train["row_id"].to_numpy()].to_numpy(dtype=np.float32)
    branch = DomainBranch(model.config.hidden_size, domains, dropout=args.dropout)
    domain_of = torch.as_tensor(domain_ids(train, domains), device=device)
    weight_of = torch.as_tensor(weights, device=device)
    gamma = float(args.gamma) if args.domain_loss else 0.0

    def loss(model, batch):
        out = model(**model_inputs(batch), output_hidden_states=True)
        d = domain_of[batch["index"]]
        g = branch.representation(out.hidden_states[-1], batch["attention_mask"], d)
        total, ce, dom = meta_teacher_loss(
            out.logits, batch["labels"], branch.domain_logits(g), corrupted_domains(d), weight_of[batch["index"]], gamma
        )
        return total, {"ce": ce.item(), "domain": dom.item()}

    def save(folder: Path, result) -> None:
        save_branch(branch, result.best_modules["domain_branch"], folder)

    return Objective(loss=loss, extra_modules={"domain_branch": (branch, None)}, save=save)
