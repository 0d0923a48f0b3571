"""A prompted teacher's causal language model (docs/methods.md §7), imported once as safetensors and loaded from there.

The import reads a local model folder, a hub name or a GGUF file and writes a folder of safetensors weights, config
and tokenizer (its chat template with it), with a manifest of checksums, atomically; every pass loads that folder
in seconds.

A GGUF file is read by transformers (with the ``gguf`` package), which dequantises its weights; transformers will
not save a model it loaded from GGUF, so the weights are moved into the same class built from the config alone,
which saves as safetensors. The checkpoint's own code is never run: ``trust_remote_code`` stays off, and a folder
that asks for code of its own is refused (:func:`kdpipe.models.loading.refuse_own_code`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from kdpipe.core.checksums import checksum, verify, write_manifest
from kdpipe.core.store import (
    KdpipeError,
    Recorded,
    atomic_path,
    ensure_disk_space,
    make_manifest,
    read_manifest,
    tensor_bytes,
)
from kdpipe.models.causal_lm_source import CausalLmImportSettings, causal_lm_problem, check_causal_lm_source
from kdpipe.models.loading import OWN_CODE, refuse_own_code

KIND = "causal_lm"  # the manifest kind of an imported causal LM folder
AUTO = "AutoModelForCausalLM"
# What an imported LLM read to become what it is: kdpipe cannot say (as for a checkpoint trained elsewhere)
OUTSIDE = {"checkpoint": "trained outside kdpipe"}


def _causal_types() -> frozenset[str]:
    from transformers.models.auto import modeling_auto

    return frozenset(modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _from_source(fn, source: str, kind: str, what: str, **kwargs):
    """``fn.from_pretrained`` of the source (a GGUF file through its folder and ``gguf_file``), with the checkpoint's
    own code off; a source that cannot be read stops with one line naming it."""
    logging.getLogger("transformers").setLevel(logging.ERROR)
    if kind == "gguf":
        path = Path(source).resolve()
        name, kwargs = str(path.parent), {**kwargs, "gguf_file": path.name}
    else:
        name = source
    try:
        return fn.from_pretrained(name, trust_remote_code=False, **kwargs)
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = (str(err).strip().splitlines() or [""])[0][:300]
        if "trust_remote_code" in str(err):
            raise KdpipeError(f"{source}: its config asks for code of its own; {OWN_CODE}") from err
        where = {"gguf": "the GGUF file", "folder": "the model folder"}.get(kind, "the hub name (not a local folder)")
        raise KdpipeError(f"cannot read the {what} of {where} {source} ({type(err).__name__}: {first})") from err


def load_source_config(source: str, where: str = "model"):
    """The source's model config, checked to be a causal language model (:func:`causal_lm_problem`)."""
    kind = check_causal_lm_source(source, where)
    if kind == "folder":
        refuse_own_code(source, AUTO, where)
    config = _from_source(AutoConfig, source, kind, "config")
    problem = causal_lm_problem(config.to_dict(), _causal_types())
    if problem:
        raise KdpipeError(f"{where}: {source}: {problem}")
    return config


def load_source_tokenizer(source: str, where: str = "model"):
    """The source's tokenizer (a GGUF file's is rebuilt from its vocabulary), padding with its end-of-text token
    when it has no padding token."""
    tokenizer = _from_source(AutoTokenizer, source, check_causal_lm_source(source, where), "tokenizer")
    return with_padding(tokenizer, source)


def with_padding(tokenizer, name: str):
    if tokenizer.pad_token is None:
        fallback = tokenizer.eos_token or tokenizer.unk_token
        if fallback is None:
            raise KdpipeError(f"the tokenizer of {name} has no padding, end-of-text or unknown token to pad with")
        tokenizer.pad_token = fallback
    return tokenizer


def _savable(model: nn.Module) -> nn.Module:
    """A model transformers will save: one loaded from GGUF carries its quantiser, which refuses to save, so its
    dequantised weights go into the same class built from the config alone (no second copy of the weights is
    initialised: transformers builds it empty and takes the state dict)."""
    if getattr(model, "hf_quantizer", None) is None:
        return model
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    rebuilt = type(model).from_pretrained(None, config=config, state_dict=model.state_dict())
    return rebuilt.eval()


def import_causal_lm(
    source: str,
    out_dir: str | Path,
    *,
    where: str = "model",
    settings: Recorded | None = None,
    tokenizer_check: Callable[[object], None] | None = None,
) -> dict:
    """Import the causal LM ``source`` (a local folder, a hub name or a GGUF file) into ``out_dir``: safetensors
    weights, ``config.json``, ``generation_config.json``, the tokenizer's files (its chat template included) and
    ``manifest.json`` (kind ``causal_lm``: the source, its kind and, for a file, its checksum; the model type,
    parameters and dtype; whether the tokenizer has a chat template; the seconds the import took; the checksum of
    every file), written atomically. ``tokenizer_check(tokenizer)`` runs as soon as the tokenizer is read, before
    the weights (the prompt checks that need a tokenizer: :func:`kdpipe.signals.prompted.check_tokenizer`).
    ``settings``: the job's settings, kept in the manifest as their slice. Returns the manifest."""
    started = time.perf_counter()
    out_dir = Path(out_dir)
    model_config = load_source_config(source, where)  # (a model that is no causal LM stops here)
    kind = check_causal_lm_source(source, where)
    tokenizer = load_source_tokenizer(source, where)
    if tokenizer_check is not None:
        tokenizer_check(tokenizer)
    model = _from_source(AutoModelForCausalLM, source, kind, "weights", config=model_config)
    model = _savable(model).eval()
    ensure_disk_space(
        out_dir, tensor_bytes(model) + 100 * len(tokenizer) + (1 << 20), f"the model folder {out_dir}", "free space"
    )
    with atomic_path(out_dir, directory=True) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        manifest = make_manifest(
            KIND,
            config=settings,
            source=str(source),
            source_kind=kind,
            source_checksum=checksum(source) if kind == "gguf" else None,
            model_type=model.config.model_type,
            architectures=list(model.config.architectures or [type(model).__name__]),
            parameters=sum(p.numel() for p in model.parameters()),
            dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
            chat_template=bool(getattr(tokenizer, "chat_template", None)),
            gold_labels=OUTSIDE,
            import_seconds=round(time.perf_counter() - started, 2),
        )
        files = sorted(p.relative_to(tmp).as_posix() for p in Path(tmp).rglob("*") if p.is_file())
        manifest = write_manifest(Path(tmp) / "manifest.json", manifest, files)
    return manifest


def import_llm(settings: CausalLmImportSettings, out: Path) -> dict:
    """The ``llm-import`` stage: the causal LM ``settings.source`` imported into the folder ``out``
    (:func:`import_causal_lm`), once for every prompted teacher and pass that runs it."""
    return import_causal_lm(settings.source, out, where="model", settings=settings)


def check_causal_lm_folder(folder: str | Path) -> dict:
    """An imported causal LM folder's manifest, after every file's checksum is verified."""
    folder = Path(folder)
    manifest = read_manifest(folder / "manifest.json", kind=KIND)
    verify(manifest, folder / "manifest.json", sorted(manifest.get("checksums") or {}), target=folder)
    return manifest


def load_causal_lm_tokenizer(folder: str | Path):
    """The tokenizer of an imported causal LM folder (fast: it reads the folder's ``tokenizer.json``)."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    return with_padding(tokenizer, str(folder))


def load_causal_lm(folder: str | Path, device: torch.device, *, attn: str = "sdpa", check: bool = True) -> nn.Module:
    """The model of an imported causal LM folder, in eval mode on ``device``: float32 on a CPU (bf16 there is far
    slower), its stored dtype on a GPU (where the passes run under bf16 autocast, kdpipe.core.device). ``attn``:
    ``sdpa`` or ``eager`` (the passes build their own attention masks for either)."""
    if check:
        check_causal_lm_folder(folder)
    logging.getLogger("transformers").setLevel(logging.ERROR)
    dtype = torch.float32 if device.type == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), trust_remote_code=False, attn_implementation=attn, dtype=dtype
    )
    return model.to(device).eval()
