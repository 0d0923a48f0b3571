"""Classifier heads of existing checkpoints: which classes they predict, matched to the dataset's labels by name.

A teacher entry with ``checkpoint:`` (docs/your-own-models-and-data.md, "Your own teachers") has its head's
``id2label`` matched to the dataset's labels by name (ignoring case when unambiguous) or through its ``label_map``,
keeping its own order, never renamed by position. Torch-free: the plan reads heads.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from kdpipe.core.store import KdpipeError
from kdpipe.data.labelspace import resolve_classes
from kdpipe.data.settings import ClassSlice

GENERIC = re.compile(r"^LABEL_\d+$")  # transformers' placeholder names when a config was saved without labels


def head_labels(checkpoint: str, where: str) -> list[str]:
    """The classes a checkpoint's head predicts, in output order (its ``id2label``)."""
    config = _model_config(checkpoint)
    if config is None:
        raise KdpipeError(
            f"{where}: cannot read the checkpoint '{checkpoint}': not a local model folder with a readable "
            "config.json and not reachable on the hub from here"
        )
    id2label = config.get("id2label")
    if not id2label:
        raise KdpipeError(f"{where}: checkpoint '{checkpoint}' has no id2label; it is not a sequence classifier")
    ids = sorted(int(i) for i in id2label)
    if ids != list(range(len(ids))):
        raise KdpipeError(f"{where}: checkpoint '{checkpoint}' has id2label ids {ids}; expected 0..{len(ids) - 1}")
    return [str(id2label[i] if i in id2label else id2label[str(i)]) for i in ids]


def fine_tuned_classes(source: str) -> list[str] | None:
    """The classes a student's ``model.init.from`` or ProKT's ``method_args.backbone`` was fine-tuned to predict,
    in output order, placeholder ``LABEL_i`` names left out (docs/methods.md, "Judging uncertainty"); None when it is
    no sequence classifier, or its config cannot be read here."""
    config = _model_config(source)
    architectures = (config or {}).get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in architectures):
        return None
    id2label = config.get("id2label") or {}
    names = [str(id2label[key]) for key in sorted(id2label, key=int)]
    return [name for name in names if not GENERIC.match(name)]


HUB_NAME = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


def _model_config(source: str) -> dict | None:
    """A local model folder's or a hub name's config; None for a builtin, a model of this run or an unreadable one."""
    if not isinstance(source, str) or source.startswith("builtin:"):
        return None
    config = Path(source) / "config.json"
    if config.is_file():
        try:
            return json.loads(config.read_text())
        except ValueError:
            return None
    if Path(source).exists() or not HUB_NAME.fullmatch(source):
        return None
    try:
        from transformers import AutoConfig  # only for hub names, so the default DAG build stays light

        return AutoConfig.from_pretrained(source).to_dict()
    except (OSError, ValueError):
        return None


def match_labels(head: list[str], labels: list[str], label_map: dict | None, where: str) -> list[str]:
    """The dataset label of each of the head's outputs, in head order (see the module docstring)."""
    label_map = dict(label_map or {})
    unknown_keys = [k for k in label_map if k not in head]
    if unknown_keys:
        raise KdpipeError(f"{where}.label_map: {unknown_keys[0]!r} is not a class of the checkpoint; it has {head}")
    by_lower: dict[str, list[str]] = {}
    for label in labels:
        by_lower.setdefault(label.lower(), []).append(label)
    matched = []
    for name in head:
        target = label_map.get(name, name)
        if target in labels:
            matched.append(target)
            continue
        if name not in label_map and len(by_lower.get(name.lower(), [])) == 1:
            matched.append(by_lower[name.lower()][0])
            continue
        matched.append(None)
        missing = target if name in label_map else name
        close = difflib.get_close_matches(missing, labels, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        generic = " The checkpoint was saved without class names." if GENERIC.match(name) else ""
        raise KdpipeError(
            f"{where}: the checkpoint's class {name!r} matches no dataset label{hint}; the data's labels are "
            f"{labels}.{generic} Map each checkpoint class with label_map: {{{name}: <dataset label>, ...}}"
        )
    twice = sorted({m for m in matched if matched.count(m) > 1})
    if twice:
        sources = [h for h, m in zip(head, matched) if m == twice[0]]
        raise KdpipeError(f"{where}: checkpoint classes {sources} all map to the dataset label {twice[0]!r}")
    return matched


def teacher_classes(
    classes: Sequence[str] | ClassSlice | None,
    labels: list[str],
    where: str,
    *,
    checkpoint: str | None,
    label_map: Mapping[str, str] | None,
    finetune: bool,
) -> tuple[list[str], bool]:
    """(the dataset labels a teacher entry predicts in its output order, whether a checkpoint's head is kept): without
    a ``checkpoint`` its ``classes``, with one the head's classes, unless ``classes`` names another set (a fresh head
    over them, which needs ``finetune``)."""
    if not checkpoint:
        return resolve_classes(classes, labels, f"{where}.classes"), False
    head = match_labels(head_labels(checkpoint, where), labels, label_map, where)
    if classes is None:
        return head, True
    chosen = resolve_classes(classes, labels, f"{where}.classes")
    if set(chosen) == set(head):
        return head, True
    if not finetune:
        raise KdpipeError(
            f"{where}.classes: {chosen}, but the checkpoint predicts {head} and finetune is false; drop classes, "
            "or set finetune: true to train a new head on them"
        )
    return chosen, False
