"""A prompted causal-LM teacher's settings, checked without a tokenizer, and its prompts as text (docs/methods.md §7).

Torch-free (no torch, no transformers): the plan calls :func:`check_prompt_teacher` when the DAG is built, so a
template without the text's slot, a class without verbalizers, an unknown class or a model that is no causal LM
stops the run before any job. The checks that need the tokenizer (a verbalizer that tokenises to nothing, two
classes whose verbalizers tokenise alike, a chat template that fails to render) are in
:mod:`kdpipe.signals.prompted` and run first thing in the pass job. The few-shot examples are drawn here
(:func:`draw_shots`), from the labels of the train split alone.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from kdpipe.core.store import KdpipeError
from kdpipe.models.causal_lm_source import check_causal_lm_source
from kdpipe.signals.prompt_settings import PromptSettings

# What a template may name; every other ``{word}`` is an error (a misspelt slot would stay in the prompt as text)
SLOTS = ("text", "text_pair", "labels")
SLOT = re.compile(r"\{(\w+)\}")
# The content-free input of ``calibrate: true`` (Zhao et al. 2021); a list of strings names others, averaged
CONTENT_FREE = ("N/A",)
CHAT = ("auto", True, False)
DEFAULTS = {
    "verbalizers": None,
    "shots": 0,
    "shot_draws": 1,
    "seed": 0,
    "calibrate": False,
    "chat": "auto",
    "max_length": 256,
}
KEYS = ("model", "templates", *DEFAULTS)
SHOT_SEPARATOR = "\n\n"  # between the few-shot examples of a prompt without a chat template


@dataclass(frozen=True)
class Template:
    """A template cut where its example starts: ``instruction`` is the text before the line that holds the first
    of the row's slots (said once, before the first example), ``example`` the rest (said for every few-shot
    example, then for the row)."""

    instruction: str
    example: str


def split_template(template: str) -> Template:
    """``template`` cut at the start of the line that holds ``{text}`` (or ``{text_pair}``, whichever comes
    first)."""
    first = min(i for i in (template.find("{text}"), template.find("{text_pair}")) if i >= 0)
    start = template.rfind("\n", 0, first) + 1
    return Template(template[:start], template[start:])


def fill(text: str, values: dict[str, str]) -> str:
    """``text`` with every slot ``{name}`` of ``values`` replaced (other braces are kept as they are)."""
    return SLOT.sub(lambda m: values[m.group(1)] if m.group(1) in values else m.group(0), text)


def answer_gap(before_answer: str) -> str:
    """What separates the prompt from its answer: nothing after white space (a newline, a chat template's
    assistant header), one space after anything else ("Topic:" + " business"). See docs/methods.md §7."""
    return "" if before_answer[-1:].isspace() else " "


def _words(value, where: str) -> list[str]:
    words = [value] if isinstance(value, str) else value
    if not isinstance(words, list) or not words:
        raise KdpipeError(f"{where}: give a word or a list of words, not {value!r}")
    for word in words:
        if not isinstance(word, str) or not word.strip():
            raise KdpipeError(f"{where}: {word!r} is not a word (an empty or blank verbalizer scores nothing)")
    if len(set(words)) < len(words):
        repeated = sorted({w for w in words if words.count(w) > 1})
        raise KdpipeError(f"{where}: {repeated[0]!r} is listed twice")
    return list(words)


def _verbalizer_set(mapping, classes: list[str], where: str) -> dict[str, list[str]]:
    if mapping is None:
        return {name: [name] for name in classes}
    if not isinstance(mapping, dict):
        raise KdpipeError(f"{where}: give a mapping {{class: [words]}}, not {type(mapping).__name__}")
    for name in mapping:
        if name not in classes:
            close = difflib.get_close_matches(str(name), classes, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KdpipeError(f"{where}: {name!r} is not a class of this teacher{hint}; its classes are {classes}")
    missing = [name for name in classes if name not in mapping]
    if missing:
        raise KdpipeError(
            f"{where}: class {missing[0]!r} has no verbalizer; name words for every class "
            f"({', '.join(map(repr, missing))} missing), or leave verbalizers out to use the class names"
        )
    sets = {name: _words(mapping[name], f"{where}.{name}") for name in classes}
    owner: dict[str, str] = {}
    for name in classes:
        for word in sets[name]:
            if word in owner:
                raise KdpipeError(
                    f"{where}: the word {word!r} names both {owner[word]!r} and {name!r}, so the two classes "
                    "cannot be told apart"
                )
            owner[word] = name
    return sets


def _template(template, pairs: bool, where: str) -> str:
    if not isinstance(template, str) or not template.strip():
        raise KdpipeError(f"{where}: a template is a non-empty string, not {template!r}")
    slots = SLOT.findall(template)
    for slot in slots:
        if slot not in SLOTS:
            close = difflib.get_close_matches(slot, SLOTS, n=1)
            hint = f" (did you mean {{{close[0]}}}?)" if close else ""
            raise KdpipeError(
                f"{where}: unknown slot {{{slot}}}{hint}; a template's slots are {{text}}, "
                "{text_pair} (sentence pairs) and {labels}"
            )
    if slots.count("text") != 1:
        raise KdpipeError(
            f"{where}: the template needs the row's text slot {{text}} exactly once (it has it "
            f"{slots.count('text')} times): {template[:60]!r}"
        )
    if pairs and slots.count("text_pair") != 1:
        raise KdpipeError(
            f"{where}: the dataset has sentence pairs, so the template needs {{text_pair}} exactly once beside {{text}}"
        )
    if not pairs and "text_pair" in slots:
        raise KdpipeError(f"{where}: the template names {{text_pair}}, but the dataset has no sentence pairs")
    if pairs and template.find("{text_pair}") < template.find("{text}"):
        raise KdpipeError(f"{where}: {{text}} must come before {{text_pair}} in the template")
    return template


def _count(completed: dict, key: str, least: int, where: str) -> int:
    value = completed[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise KdpipeError(f"{where}.{key}: {value!r} is not a whole number of at least {least}")
    return value


def prompt_settings(prompt: dict, *, classes: list[str], pairs: bool, where: str) -> dict:
    """The prompt settings of one teacher (its config's ``prompt`` section), checked and completed with the
    defaults: ``templates`` a list, ``verbalizers`` a list of sets ``{class: [words]}`` that each cover ``classes``
    (the teacher's classes), ``calibrate`` the list of content-free inputs (empty: no calibration). ``pairs``: the
    dataset has a second text per row. Raises KdpipeError with one line naming ``where`` (the config key) and the
    template, verbalizer set or class at fault."""
    if not isinstance(prompt, dict):
        raise KdpipeError(f"{where}: expected a mapping with model and templates, not {type(prompt).__name__}")
    unknown = [key for key in prompt if key not in KEYS]
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KdpipeError(f"{where}: unknown key {unknown[0]!r}{hint}; the keys are {', '.join(KEYS)}")
    for key in ("model", "templates"):
        if not prompt.get(key):
            raise KdpipeError(f"{where}.{key}: missing; a prompted teacher needs a model and at least one template")
    if not classes:
        raise KdpipeError(f"{where}: the teacher has no classes to score")
    settings = {**DEFAULTS, **prompt}
    if not isinstance(settings["model"], str):
        raise KdpipeError(f"{where}.model: a local folder, a GGUF file or a hub name, not {settings['model']!r}")
    templates = settings["templates"]
    templates = [templates] if isinstance(templates, str) else templates
    if not isinstance(templates, list):
        raise KdpipeError(f"{where}.templates: a template or a list of templates, not {templates!r}")
    settings["templates"] = [_template(t, pairs, f"{where}.templates[{i}]") for i, t in enumerate(templates)]
    verbalizers = settings["verbalizers"]
    several = isinstance(verbalizers, list)
    sets = verbalizers if several else [verbalizers]
    if several and not sets:
        raise KdpipeError(f"{where}.verbalizers: an empty list; leave verbalizers out to use the class names")
    settings["verbalizers"] = [
        _verbalizer_set(s, list(classes), f"{where}.verbalizers" + (f"[{i}]" if several else ""))
        for i, s in enumerate(sets)
    ]
    _count(settings, "shots", 0, where)
    _count(settings, "shot_draws", 1, where)
    _count(settings, "max_length", 1, where)
    if isinstance(settings["seed"], bool) or not isinstance(settings["seed"], int):
        raise KdpipeError(f"{where}.seed: {settings['seed']!r} is not a whole number")
    if settings["shot_draws"] > 1 and settings["shots"] == 0:
        raise KdpipeError(
            f"{where}.shot_draws: {settings['shot_draws']} draws of no example are the same prompt; set shots "
            "(examples per class) or leave shot_draws at 1"
        )
    settings["calibrate"] = _content_free(settings["calibrate"], f"{where}.calibrate")
    if settings["chat"] not in CHAT:
        raise KdpipeError(f"{where}.chat: {settings['chat']!r} is not one of auto, true, false")
    return settings


def _content_free(value, where: str) -> list[str]:
    if value is False or value is None or (isinstance(value, list | tuple) and not value):
        return []  # (an empty list: the completed settings of no calibration)
    if value is True:
        return list(CONTENT_FREE)
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        if len(set(value)) < len(value):
            raise KdpipeError(f"{where}: a content-free input is listed twice: {value}")
        return list(value)
    raise KdpipeError(f"{where}: true, false or a list of content-free inputs such as ['N/A', '', '[MASK]']")


def members(settings: PromptSettings) -> list[dict]:
    """The prompt ensemble's members, in order: every template × verbalizer set × shot draw, each as
    ``{"name": "t<i>.v<j>.d<k>", "template": i, "verbalizers": j, "draw": k}`` (numbered from 0)."""
    return [
        {"name": f"t{t}.v{v}.d{d}", "template": t, "verbalizers": v, "draw": d}
        for t in range(len(settings.templates))
        for v in range(len(settings.verbalizers))
        for d in range(settings.shot_draws)
    ]


def typed(prompt: dict, *, classes: list[str], pairs: bool, where: str) -> PromptSettings:
    """:func:`prompt_settings` as the typed :class:`~kdpipe.signals.prompt_settings.PromptSettings` the passes take."""
    return PromptSettings.from_params(prompt_settings(prompt, classes=classes, pairs=pairs, where=where), where)


def check_prompt_teacher(prompt: dict, *, classes: list[str], pairs: bool, where: str) -> dict:
    """Every check of a prompted teacher that needs neither a tokenizer nor the model's weights, for the plan: the
    settings (:func:`prompt_settings`, returned completed) and the model source (a GGUF file that is one, a local
    folder whose config names a causal language model:
    :func:`kdpipe.models.causal_lm_source.check_causal_lm_source`)."""
    settings = prompt_settings(prompt, classes=classes, pairs=pairs, where=where)
    check_causal_lm_source(settings["model"], f"{where}.model")
    return settings


def draw_shots(labels, classes: list[str], *, shots: int, draw: int, seed: int, where: str):
    """The few-shot examples of one draw: ``shots`` rows of each class of ``classes``, drawn without replacement
    from the rows whose label (``labels``: the train split's labels, as names, in its row order) is that class,
    with the generator seeded by ``(seed, draw)``; then shuffled together, so that no class always comes last.
    Returns the rows' positions in the split, in prompt order (none for zero-shot)."""
    import numpy as np

    if shots == 0:
        return np.zeros(0, dtype=np.int64)
    labels = np.asarray(labels)
    rng = np.random.default_rng([seed, draw])
    chosen = []
    for name in classes:
        rows = np.flatnonzero(labels == name)
        if len(rows) < shots:
            raise KdpipeError(
                f"{where}.shots: {shots} examples per class, but the train split has {len(rows)} rows of "
                f"class {name!r}; lower shots"
            )
        chosen.append(rows[rng.choice(len(rows), shots, replace=False)])
    picked = np.concatenate(chosen)
    return picked[rng.permutation(len(picked))]
