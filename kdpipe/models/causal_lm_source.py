"""Where a prompted teacher's causal language model comes from, and whether it is one, told without torch or
transformers (docs/methods.md §7).

The plan checks a local model folder's ``config.json`` and a GGUF file's header when the DAG is built;
:mod:`kdpipe.models.causal_lm` applies the same rule to the config transformers reads.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kdpipe.core.settings import Settings
from kdpipe.core.store import KdpipeError

GGUF_MAGIC = b"GGUF"
# The class names transformers gives a decoder with its language-model head: LlamaForCausalLM, Qwen2ForCausalLM...,
# and GPT-2's family (GPT2LMHeadModel, GPTJForCausalLM)
CAUSAL_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class CausalLmImportSettings(Settings):
    """The ``llm-import`` job's settings (docs/design.md, "Style": settings read once): the model's ``source`` (a
    local folder, a GGUF file or a hub name) and the digest of a local one (``local_content``), so that a file
    changed in place is imported again."""

    source: str
    local_content: Mapping[str, str] | None = None


def source_kind(model: str) -> str:
    """``gguf`` (a ``.gguf`` file), ``folder`` (a local model folder) or ``hub`` (a name on the Hugging Face hub)."""
    path = Path(model)
    if path.suffix.lower() == ".gguf":
        return "gguf"
    if path.is_dir():
        return "folder"
    return "hub"


def causal_lm_problem(model_config: dict, causal_types: frozenset[str] | None = None) -> str | None:
    """Why a model config is not a causal language model, or None when it is one: its ``architectures`` must name a
    class with a language-model head on a decoder (:data:`CAUSAL_SUFFIXES`); a config without ``architectures`` (one
    read from a GGUF file) must be of a ``model_type`` in ``causal_types`` (transformers' causal-LM model types,
    when the caller has them) and no encoder-decoder."""
    architectures = [str(a) for a in model_config.get("architectures") or []]
    model_type = model_config.get("model_type")
    if architectures:
        if any(a.endswith(CAUSAL_SUFFIXES) for a in architectures):
            return None
        return (
            f"it is a {', '.join(architectures)} (model_type {model_type!r}), not a causal language model: a prompted "
            "teacher needs a decoder with its language-model head (a ...ForCausalLM), such as an instruction-tuned "
            "Llama, Qwen2 or SmolLM2"
        )
    if model_config.get("is_encoder_decoder"):
        return f"its model_type {model_type!r} is an encoder-decoder, not a causal language model"
    if causal_types is not None and model_type not in causal_types:
        return f"its model_type {model_type!r} has no causal language model in transformers"
    return None


def check_causal_lm_source(model: str, where: str) -> str:
    """What can be told of ``model`` before anything is loaded; returns its :func:`source_kind`. A GGUF file must
    exist and start with the GGUF magic bytes; a local folder's ``config.json`` must name a causal language model
    (:func:`causal_lm_problem`); a hub name is checked only when its job loads it."""
    kind = source_kind(model)
    if kind == "gguf":
        path = Path(model)
        if not path.is_file():
            raise KdpipeError(f"{where}: {model}: no such GGUF file")
        with open(path, "rb") as fh:
            if fh.read(4) != GGUF_MAGIC:
                raise KdpipeError(f"{where}: {model}: not a GGUF file (it does not start with the bytes 'GGUF')")
    elif kind == "folder":
        config_file = Path(model) / "config.json"
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError) as err:
            raise KdpipeError(f"{where}: {config_file}: cannot be read as a model config ({err})") from None
        problem = causal_lm_problem(config if isinstance(config, dict) else {})
        if problem:
            raise KdpipeError(f"{where}: {model}: {problem}")
    return kind
