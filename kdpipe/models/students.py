"""Students: a smaller transformer, a layer subset of a backbone, a BiLSTM, each optionally with several heads.

The architecture modules (BiLSTM, multi-head) are imported by name: only the students that use them carry them in
their code fingerprint (:func:`kdpipe.models.backbones.architecture_modules`).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, BertConfig

from kdpipe.core.store import KdpipeError
from kdpipe.models.loading import keep_layers, label_maps, load_classifier, load_tokenizer
from kdpipe.models.settings import BertSpec, StudentModel


def build_student(
    spec: StudentModel, labels: list[str], *, seed: int, pairs: bool = False, attn: str | None = None
) -> tuple[nn.Module, object]:
    """The student model and its tokenizer, from the student's ``model`` (docs/configuration.md,
    ``students.<name>.model``; ``pairs``: the data has sentence pairs, for a BiLSTM). ``attn``: the attention
    implementation of a transformer student (``"eager"`` where a loss reads its attention maps, which SDPA does not
    return)."""
    heads = spec.heads
    if spec.head_init != "copy" and not heads:
        raise KdpipeError(f"model.head_init: {spec.head_init!r} starts the heads of a multi-head student; set heads")
    if spec.type == "bilstm":
        tokenizer = load_tokenizer("builtin:minilm-l6" if spec.tokenizer is None else spec.tokenizer)
        bilstm = importlib.import_module("kdpipe.models.bilstm")
        sizes = {k: getattr(spec, k) for k in ("embedding_dim", "hidden_size", "fc_size", "dropout")}
        model = bilstm.make_bilstm(tokenizer, labels, pairs=pairs, seed=seed, **sizes)
        return model, tokenizer
    kwargs = {"attn_implementation": attn} if attn else {}
    if spec.init:
        model = load_classifier(spec.init.from_, labels, seed=seed, attn=attn)
        if spec.init.layers is not None:
            keep_layers(model, list(spec.init.layers))
        tokenizer = load_tokenizer(spec.init.from_)
    else:
        cfg = spec.config or BertSpec()
        tokenizer = load_tokenizer("builtin:minilm-l6" if cfg.tokenizer is None else cfg.tokenizer)
        torch.manual_seed(seed)
        config = BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=128 if cfg.hidden_size is None else cfg.hidden_size,
            num_hidden_layers=2 if cfg.num_layers is None else cfg.num_layers,
            num_attention_heads=2 if cfg.num_heads is None else cfg.num_heads,
            intermediate_size=512 if cfg.intermediate_size is None else cfg.intermediate_size,
            max_position_embeddings=512,
            **label_maps(labels),
        )
        model = AutoModelForSequenceClassification.from_config(config, **kwargs)
    if heads:
        multihead = importlib.import_module("kdpipe.models.multihead")
        model = multihead.make_multihead(
            model,
            int(heads.count),
            1 if heads.layers is None else int(heads.layers),
            seed=seed,
            head_init=spec.head_init,
            head_noise=spec.head_noise,
        )
    return model, tokenizer
