"""Students: a smaller transformer, a layer subset of a backbone, a BiLSTM, each optionally with several heads.

The architecture modules (:mod:`kdpipe.models.bilstm`, :mod:`kdpipe.models.multihead`) are imported by name, and
the plan adds them to the code fingerprint of exactly the students that use them
(:func:`kdpipe.models.backbones.architecture_modules`).
"""

from __future__ import annotations

import importlib

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification, BertConfig

from kdpipe.core.store import KdpipeError
from kdpipe.models.loading import keep_layers, label_maps, load_classifier, load_tokenizer


def build_student(
    spec: dict, labels: list[str], *, seed: int, pairs: bool = False, attn: str | None = None
) -> tuple[nn.Module, object]:
    """The student model and its tokenizer, from the student's ``model`` config (docs/configuration.md,
    ``students.<name>.model``): a layer subset of a backbone, a smaller BERT from scratch or ProKT's BiLSTM
    (``kdpipe.models.bilstm``; ``pairs``: the data has sentence pairs), made a multi-head (Hydra) student by
    ``heads`` (``kdpipe.models.multihead``, started as ``head_init`` says). ``attn``: the attention implementation of
    a transformer student (``"eager"`` where a loss reads its attention maps, which SDPA does not return)."""
    heads = spec.get("heads")
    if spec.get("head_init", "copy") != "copy" and not heads:
        raise KdpipeError(f"model.head_init: {spec['head_init']!r} starts the heads of a multi-head student; set heads")
    if spec.get("type") == "bilstm":
        tokenizer = load_tokenizer(spec.get("tokenizer", "builtin:minilm-l6"))
        bilstm = importlib.import_module("kdpipe.models.bilstm")
        return bilstm.make_bilstm(spec, tokenizer, labels, pairs=pairs, seed=seed), tokenizer
    model, tokenizer = _single_student(spec, labels, seed=seed, attn=attn)
    if heads:
        multihead = importlib.import_module("kdpipe.models.multihead")
        start = {k: spec[k] for k in ("head_init", "head_noise") if k in spec}  # absent: make_multihead's defaults
        model = multihead.make_multihead(model, int(heads["count"]), int(heads.get("layers", 1)), seed=seed, **start)
    return model, tokenizer


def _single_student(spec: dict, labels: list[str], *, seed: int, attn: str | None = None) -> tuple[nn.Module, object]:
    """The one-head student of ``spec`` (see :func:`build_student`)."""
    if spec.get("init"):
        init = spec["init"]
        model = load_classifier(init["from"], labels, seed=seed, attn=attn)
        if init.get("layers") is not None:
            keep_layers(model, list(init["layers"]))
        return model, load_tokenizer(init["from"])
    cfg = spec.get("config") or {}
    tokenizer = load_tokenizer(cfg.get("tokenizer", "builtin:minilm-l6"))
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=cfg.get("hidden_size", 128),
        num_hidden_layers=cfg.get("num_layers", 2),
        num_attention_heads=cfg.get("num_heads", 2),
        intermediate_size=cfg.get("intermediate_size", 512),
        max_position_embeddings=512,
        **label_maps(labels),
    )
    kwargs = {"attn_implementation": attn} if attn else {}
    return AutoModelForSequenceClassification.from_config(config, **kwargs), tokenizer
