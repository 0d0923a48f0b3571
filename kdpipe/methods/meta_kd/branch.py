"""Meta-KD's domain branch (docs/methods.md §4), shared by the meta-teacher and the Meta-KD student.

g = W_g(E_dom[d] + ē), ē the token mean of the last hidden state, is the domain representation (dumped, and matched
by the student); ℓ = W_d · Dropout(tanh(g)) the domain logits of the meta-teacher's domain-corruption loss. The
branch is saved beside the teacher as ``domain_branch.safetensors`` + ``domain_branch.json``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from kdpipe.core.store import ArtifactError, read_json, write_json

BRANCH_WEIGHTS, BRANCH_FILE = "domain_branch.safetensors", "domain_branch.json"


def token_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``hidden`` [B, S, H] over the positions where ``mask`` [B, S] is 1. Shape [B, H]."""
    mask = mask.to(hidden.dtype)
    return (hidden * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)


class DomainBranch(nn.Module):
    """E_dom, W_g and (for a meta-teacher) the domain classifier W_d of width ``hidden`` over ``domains``."""

    def __init__(self, hidden: int, domains: list[str], *, classify: bool = True, dropout: float = 0.1):
        super().__init__()
        self.domains, self.dropout_p = list(domains), float(dropout)
        self.embedding = nn.Embedding(len(domains), hidden)
        nn.init.normal_(self.embedding.weight, std=0.02)  # BERT's initializer range, as the backbone's own
        self.project = nn.Linear(hidden, hidden)  # W_g
        self.dropout = nn.Dropout(dropout)
        self.classify = nn.Linear(hidden, len(domains)) if classify else None  # W_d

    def representation(self, last_hidden: torch.Tensor, mask: torch.Tensor, domain_ids: torch.Tensor) -> torch.Tensor:
        """g = W_g(E_dom[d] + ē), shape [B, H]."""
        return self.project(self.embedding(domain_ids) + token_mean(last_hidden.float(), mask))

    def domain_logits(self, g: torch.Tensor) -> torch.Tensor:
        """ℓ = W_d · Dropout(tanh(g)), shape [B, K]."""
        return self.classify(self.dropout(torch.tanh(g)))


def save_branch(branch: DomainBranch, state: dict, folder: Path) -> None:
    """Write ``state`` (the branch's best weights) and its shape into a model folder."""
    save_file({k: v.contiguous() for k, v in state.items()}, str(Path(folder) / BRANCH_WEIGHTS))
    write_json(
        Path(folder) / BRANCH_FILE,
        {"domains": branch.domains, "hidden_size": branch.embedding.embedding_dim, "dropout": branch.dropout_p},
    )


def load_branch(model_dir: Path) -> DomainBranch:
    """The domain branch saved beside a meta-teacher (eval mode)."""
    spec_path = Path(model_dir) / BRANCH_FILE
    if not spec_path.is_file():
        raise ArtifactError(
            f"{model_dir}: no {BRANCH_FILE}; only a teacher trained with objective: meta has a domain branch"
        )
    spec = read_json(spec_path)
    branch = DomainBranch(spec["hidden_size"], spec["domains"], dropout=spec["dropout"])
    branch.load_state_dict(load_file(str(Path(model_dir) / BRANCH_WEIGHTS)))
    return branch.eval()
