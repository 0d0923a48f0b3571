"""A multi-head (Hydra) student on a BERT-like sequence classifier (docs/methods.md §3).

The core is the embeddings and the lower L − k transformer layers; each head is its own copy of the top k layers,
the pooler, the dropout and a classifier Linear. The prediction, the heads' mean softmax probability, is returned
as its log in ``.logits``, so code that takes ``softmax(logits)`` gets the Hydra prediction.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, PretrainedConfig
from transformers.masking_utils import create_bidirectional_mask

from kdpipe.core.store import KdpipeError
from kdpipe.models.loading import reinit, save_kdpipe_model

MULTIHEAD_FILE = "multihead.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class MultiHeadOutput:
    """``logits`` [B, C]: log of the heads' mean probability; ``head_logits`` [M, B, C]: each head's raw logits."""

    logits: torch.Tensor
    head_logits: torch.Tensor


class Head(nn.Module):
    """One Hydra head: the top transformer layers, the pooler (first token), dropout and a classifier Linear."""

    def __init__(self, layers: nn.ModuleList, pooler: nn.Module, dropout: nn.Module, classifier: nn.Linear):
        super().__init__()
        self.layers = layers
        self.pooler = pooler
        self.dropout = dropout
        self.classifier = classifier

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        for layer in self.layers:
            hidden = layer(hidden, mask)
        return self.classifier(self.dropout(self.pooler(hidden)))


class MultiHeadClassifier(nn.Module):
    """Shared core (embeddings + lower layers) and M heads (docs/methods.md §3), made by :func:`make_multihead`."""

    def __init__(self, config: PretrainedConfig, embeddings: nn.Module, core: nn.ModuleList, heads: list[Head]):
        super().__init__()
        self.config = config
        self.embeddings = embeddings
        self.core = core
        self.heads = nn.ModuleList(heads)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **ignored,
    ) -> MultiHeadOutput:
        """Other keyword arguments (e.g. ``labels``) are ignored: the losses live in the method."""
        hidden = self.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
        # the mask BertModel builds: additive float for eager attention, boolean or None (no padding) for sdpa
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        for layer in self.core:
            hidden = layer(hidden, mask)
        head_logits = torch.stack([head(hidden, mask) for head in self.heads])
        return MultiHeadOutput(logits=mean_probs_log(head_logits), head_logits=head_logits)

    def head_linears(self) -> list[list[nn.Linear]]:
        """For each head, all its Linear modules in the same order."""
        return [[m for m in head.modules() if isinstance(m, nn.Linear)] for head in self.heads]

    def save_pretrained(self, out_dir: str | Path, **_ignored) -> None:
        """``multihead.json`` holds the base classifier's config: transformers must not load the folder as one."""
        spec = {"heads": len(self.heads), "head_layers": len(self.heads[0].layers), "config": self.config.to_dict()}
        save_kdpipe_model(self, out_dir, "multihead", json.dumps(spec))


def mean_probs_log(head_logits: torch.Tensor) -> torch.Tensor:
    """log((1/M) Σ_m softmax(s_m)) over the head axis 0, in float32. Shape [B, C]."""
    return torch.logsumexp(F.log_softmax(head_logits.float(), -1), 0) - math.log(head_logits.shape[0])


HEAD_INITS = ("copy", "noise", "reinit")  # how the heads start; defaults: kdpipe.models.backbones.HEAD_INIT_DEFAULTS
# streams of a head's generator besides its classifier's, which is seeded by (seed, head) alone
_NOISE_STREAM, _REINIT_STREAM = 1, 2


def _generator(*key: int) -> torch.Generator:
    """A CPU generator seeded from ``key`` (e.g. (seed, head, stream)) through numpy's SeedSequence."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1)[0]))


def add_noise(head: nn.Module, scale: float, generator: torch.Generator) -> None:
    """Add N(0, (scale·std(W))²) noise to every Linear weight W of ``head``, in module order from ``generator``:
    copies of one layer then differ by about ``scale`` relative to its spread."""
    with torch.no_grad():
        for module in head.modules():
            if isinstance(module, nn.Linear):
                weight = module.weight
                noise = torch.randn(weight.shape, generator=generator, dtype=torch.float32)
                weight.add_((noise * scale * weight.float().std()).to(weight.dtype))


def make_multihead(
    model: nn.Module, heads: int, head_layers: int, seed: int, head_init: str = "copy", head_noise: float = 0.01
) -> MultiHeadClassifier:
    """A Hydra student from a BERT-like classifier with L layers (taken over: do not use ``model`` afterwards).

    Head 0 is the base's own top (one head reproduces the base model exactly); head m ≥ 1 gets a classifier
    re-initialised from (``seed``, m), then ``head_init`` (docs/methods.md §3) from (``seed``, m, stream).
    ``head_layers`` must lie in 1..L−1 (the core keeps a layer).
    """
    try:  # a BERT-family classifier's parts
        base = model.base_model
        parts = (base.embeddings, base.encoder.layer, base.pooler, model.dropout, model.classifier)
    except AttributeError:
        parts = (None,) * 5
    if any(part is None for part in parts) or not isinstance(parts[4], nn.Linear):
        raise KdpipeError(
            f"a multi-head student needs a BERT-like sequence classifier (embeddings, "
            f"encoder.layer, pooler, dropout, Linear classifier); got {type(model).__name__}"
        )
    embeddings, layers, pooler, dropout, classifier = parts
    n = len(layers)
    if heads < 1:
        raise KdpipeError(f"model.heads.count must be at least 1, got {heads}")
    if not 1 <= head_layers < n:
        raise KdpipeError(
            f"model.heads.layers must lie in 1..{n - 1} for a {n}-layer model (the shared core "
            f"keeps at least one layer), got {head_layers}"
        )
    if head_init not in HEAD_INITS:
        raise KdpipeError(f"model.head_init: {head_init!r}; choose one of {', '.join(HEAD_INITS)}")
    if not float(head_noise) >= 0:
        raise KdpipeError(f"model.head_noise must be non-negative, got {head_noise}")
    config = model.config
    keep = {id(config): config}  # the copies share the config object (attention implementation) with the core
    std = getattr(config, "initializer_range", 0.02)
    top = nn.ModuleList(layers[n - head_layers :])
    made = []
    for m in range(heads):
        head = Head(
            copy.deepcopy(top, dict(keep)),
            copy.deepcopy(pooler, dict(keep)),
            copy.deepcopy(dropout),
            copy.deepcopy(classifier),
        )
        if m:
            reinit(head.classifier, std, _generator(seed, m))  # BERT's init of a new classifier
            if head_init == "noise":
                add_noise(head, float(head_noise), _generator(seed, m, _NOISE_STREAM))
            elif head_init == "reinit":
                generator = _generator(seed, m, _REINIT_STREAM)
                reinit(head.layers, std, generator)
                reinit(head.pooler, std, generator)
        made.append(head)
    config.multihead_heads, config.multihead_head_layers = heads, head_layers
    return MultiHeadClassifier(config, embeddings, nn.ModuleList(layers[: n - head_layers]), made)


def load_multihead(model_dir: str | Path, *, attn: str | None = None) -> MultiHeadClassifier:
    """A multi-head model written by :meth:`MultiHeadClassifier.save_pretrained`, in eval mode (``attn``: the
    attention implementation; None: transformers' default)."""
    model_dir = Path(model_dir)
    spec = json.loads((model_dir / MULTIHEAD_FILE).read_text())
    config = AutoConfig.for_model(**spec["config"])
    kwargs = {"attn_implementation": attn} if attn else {}
    base = AutoModelForSequenceClassification.from_config(config, **kwargs)
    model = make_multihead(base, int(spec["heads"]), int(spec["head_layers"]), seed=0)
    model.load_state_dict(load_file(str(model_dir / WEIGHTS_FILE)))
    return model.eval()
