"""Facts about backbones that the plan needs before anything is loaded (torch-free)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from kdpipe.core.store import KdpipeError
from kdpipe.models.settings import StudentModel

# (transformer layers, attention heads, hidden size) of the builtins (kdpipe.models.loading.TINY_BERT for tiny-bert)
BUILTIN_SIZES = {"builtin:minilm-l6": (6, 12, 384), "builtin:tiny-bert": (2, 2, 32)}

# The names a config gives its depth and heads per layer, where ``AutoConfig`` has no attribute map for them
LAYER_KEYS = ("num_hidden_layers", "n_layers", "num_layers", "n_layer")
HEAD_KEYS = ("num_attention_heads", "n_heads", "num_heads", "n_head")


def model_shape(model: str) -> tuple[int, int]:
    """(transformer layers, attention heads) of a builtin, a local model folder or a hub name (``AutoConfig``);
    transformers is imported only here, so the default config's DAG build does without it."""
    if model in BUILTIN_SIZES:
        return BUILTIN_SIZES[model][:2]
    config = _auto_config(model, f"how many layers and heads '{model}' has")
    return _config_int(config, LAYER_KEYS, model, "layers"), _config_int(config, HEAD_KEYS, model, "heads")


def _auto_config(model: str, what: str):
    """``model``'s config through ``AutoConfig``, or a KdpipeError saying that kdpipe cannot tell ``what``."""
    try:
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as err:
        raise KdpipeError(
            f"cannot tell {what}: not a builtin, not a local model folder, and not reachable on the hub from here "
            f"({type(err).__name__})"
        ) from err


def _config_int(model_config: object, keys: tuple[str, ...], model: str, what: str) -> int:
    """The first of ``keys`` that a model's config sets to an integer."""
    for key in keys:
        value = getattr(model_config, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    raise KdpipeError(
        f"cannot tell how many {what} '{model}' has: its config ({model_config.model_type}) has none of "
        f"{', '.join(keys)}"
    )


HIDDEN_KEYS = ("hidden_size", "d_model", "dim", "n_embd")


def hidden_size(model: str) -> int:
    """The hidden size of a builtin, a local model folder (its ``config.json``) or a hub name (``AutoConfig``)."""
    if model in BUILTIN_SIZES:
        return BUILTIN_SIZES[model][2]
    config_file = Path(model) / "config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except ValueError as err:
            raise KdpipeError(f"{config_file}: not JSON ({err}); cannot tell the hidden size of '{model}'") from err
        return _config_int(SimpleNamespace(**{"model_type": None, **config}), HIDDEN_KEYS, model, "hidden units")
    return _config_int(_auto_config(model, f"the hidden size of '{model}'"), HIDDEN_KEYS, model, "hidden units")


def student_layers(model: StudentModel) -> int:
    """Transformer layers of a student built from its ``model`` (``kdpipe.models.students.build_student``)."""
    if model.init:
        return len(model.init.layers) if model.init.layers is not None else model_shape(model.init.from_)[0]
    return 2 if model.config is None or model.config.num_layers is None else int(model.config.num_layers)


def student_heads(model: StudentModel) -> int:
    """Attention heads per layer of a student built from its ``model``."""
    if model.init:
        return model_shape(model.init.from_)[1]
    return 2 if model.config is None or model.config.num_heads is None else int(model.config.num_heads)


def strided_alignment(teacher_layers: int, student_layers: int, count: int = -1) -> list[tuple[int, int]]:
    """(student, teacher) hidden-state indices as in MUKI's DFA (docs/methods.md §1): student layer L_s − j with
    teacher layer L_t − j·(L_t // L_s), j = 0 .. count−1 (−1: every student layer; the embeddings are not aligned)."""
    if student_layers < 1 or teacher_layers < student_layers:
        raise KdpipeError(f"cannot align a {student_layers}-layer student with a {teacher_layers}-layer teacher")
    stride = teacher_layers // student_layers
    count = student_layers if count in (-1, None) else min(int(count), student_layers)
    return [(student_layers - j, teacher_layers - j * stride) for j in range(count)]


def uniform_alignment(teacher_layers: int, student_layers: int) -> list[tuple[int, int]]:
    """(student, teacher) hidden-state indices l ↔ l·L_t/L_s for l = 0..L_s, the embeddings included, as in Dynamic
    KD's objective adjustment (docs/methods.md §2c); L_t must be a multiple of L_s."""
    if student_layers < 1 or teacher_layers < student_layers or teacher_layers % student_layers:
        raise KdpipeError(
            f"uniform layer alignment needs the teacher's layers ({teacher_layers}) to be a multiple "
            f"of the student's ({student_layers})"
        )
    k = teacher_layers // student_layers
    return [(layer, layer * k) for layer in range(student_layers + 1)]


# How a multi-head student's heads start (docs/methods.md §3), the schema's defaults (make_multihead's must match)
HEAD_INIT_DEFAULTS = {"head_init": "copy", "head_noise": 0.01}


def architecture_modules(model: StudentModel) -> list[str]:
    """The modules of a student's architecture beyond a Hugging Face classifier (imported by name)."""
    modules = []
    if model.type == "bilstm":
        modules.append("kdpipe.models.bilstm")
    if model.heads:
        modules.append("kdpipe.models.multihead")
    return modules


def stored_dropout(model: str) -> float | None:
    """The largest ``*dropout*`` number a stored model's ``config.json`` sets (None: a hub name). MC-dropout needs it
    above zero, or its samples are all equal."""
    if model in BUILTIN_SIZES:
        return 0.1  # the builtins keep BERT's default dropout (on hidden states and attention probabilities)
    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    rates = [v for k, v in config.items() if "dropout" in k and isinstance(v, (int, float)) and not isinstance(v, bool)]
    return max(rates, default=0.0)


# A model folder's weights as transformers looks for them: safetensors, or pickle files, which kdpipe never reads
# (unpickling a file can run code)
SAFETENSORS_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
PICKLE_WEIGHTS = "pytorch_model*.bin"


def refuse_pickle_weights(folder: str, where: str = "") -> None:
    """Refuse a local model folder whose weights are only pickle files (``pytorch_model.bin``), saying how to convert
    it (torch-free: the plan runs it before any job). ``where``: the config key that names it."""
    path = Path(folder)
    if not path.is_dir() or any(any(path.glob(pattern)) for pattern in SAFETENSORS_WEIGHTS):
        return
    pickles = sorted(p.name for p in path.glob(PICKLE_WEIGHTS))
    if not pickles:
        return
    try:
        architectures = json.loads((path / "config.json").read_text()).get("architectures") or []
    except (OSError, ValueError, AttributeError):
        architectures = []
    model_class = architectures[0] if architectures and str(architectures[0]).isidentifier() else "AutoModel"
    raise KdpipeError(
        f"{where + ': ' if where else ''}{path}: its weights are only in a pickle file ({pickles[0]}), which kdpipe "
        "does not load (unpickling a file can run code); convert the folder to safetensors once, in a Python session "
        f"you trust: `from transformers import {model_class}; {model_class}.from_pretrained('{path}')"
        f".save_pretrained('{path}', safe_serialization=True)` writes model.safetensors beside it"
    )
