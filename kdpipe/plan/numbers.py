"""Numbers that YAML read as text, caught before the schema refuses them without saying why.

PyYAML (YAML 1.1) reads a float only with a dot and a signed exponent: ``1e-3``, ``5E-5`` and ``1.0e3`` are
strings, so ``lr: 1e-3`` would reach the schema as ``'1e-3'`` and fail as "not of type 'number'".
:func:`check_numbers` walks the config as written (before the schema fills in defaults) against the schema's
number and integer keys, and the declared float and int arguments of each method and teacher objective, and names
the first such value with the spelling to use instead. Torch-free: it runs when the DAG is built.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from kdpipe.core.store import KdpipeError
from kdpipe.methods.registry import METHODS, TEACHER_OBJECTIVES
from kdpipe.plan.entries import STAGE_SETTINGS

# a number in scientific notation, as PyYAML reads it (mantissa, exponent)
SCIENTIFIC = re.compile(r"^([+-]?)(\d*)(?:\.(\d*))?[eE]([+-]?)(\d+)$")
NUMBER_ARGS = {"float": "number", "int": "integer"}  # method argument types (kdpipe.methods.registry) as schema types


def check_numbers(config: dict, schema: dict) -> None:
    """Refuse, naming the full key, a number-typed key whose value is a string that reads as a number, and an
    integer-typed key given a whole float (``17.0``): the keys of
    the schema (an entry of ``teachers`` or ``students`` against ``teacher_defaults`` or ``student_defaults``), a
    student's ``method_args`` (with Meta-KD's ``stage1``) and a teacher's ``objective_args``."""
    props = schema.get("properties", {})
    for section, value in config.items():
        if section in ("teachers", "students"):
            for name, entry in _entries(config, section):
                _walk(entry, props.get(f"{section[:-1]}_defaults", {}), f"{section}.{name}")
        elif section in props:
            _walk(value, props[section], section)
    teacher_defaults = config.get("teacher_defaults") or {}
    for name, entry in _entries(config, "teachers"):
        objective = entry.get("objective", teacher_defaults.get("objective", _default(props, "teacher", "objective")))
        declared = _number_args(TEACHER_OBJECTIVES.get(objective) if isinstance(objective, str) else None)
        for where, args in (
            (f"teachers.{name}.objective_args", entry.get("objective_args")),
            ("teacher_defaults.objective_args", teacher_defaults.get("objective_args")),
        ):
            _check_args(args, declared, where)
    student_defaults = config.get("student_defaults") or {}
    settings_schema = {"properties": props.get("student_defaults", {}).get("properties", {})}
    for name, entry in _entries(config, "students"):
        method = entry.get("method", student_defaults.get("method", _default(props, "student", "method")))
        spec = METHODS.get(method) if isinstance(method, str) else None  # an unknown method is named by the plan
        declared = _number_args(spec)
        for where, args in (
            (f"students.{name}.method_args", entry.get("method_args")),
            ("student_defaults.method_args", student_defaults.get("method_args")),
        ):
            if not isinstance(args, dict):
                continue
            _check_args({k: v for k, v in args.items() if k != "stage1"}, declared, where)
            stage1 = args.get("stage1")
            if spec and spec.first_stage and isinstance(stage1, dict):  # the first stage's settings and method_args
                settings = {k: v for k, v in stage1.items() if k in STAGE_SETTINGS}
                _walk(settings, settings_schema, f"{where}.stage1")
                others = {k: v for k, v in stage1.items() if k not in settings}
                _check_args(others, _number_args(METHODS[spec.first_stage]), f"{where}.stage1")


def number_hint(where: str, value: str, kind: str = "number") -> str | None:
    """The message for a string ``value`` at ``where`` that reads as a number of ``kind`` (None if it does not)."""
    text = value.strip()
    if not re.search(r"\d", text):  # "inf", "nan": not what anyone means by a number here
        return None
    try:
        number = Decimal(text.replace("_", ""))
    except InvalidOperation:
        return None
    if kind == "integer" and number != number.to_integral_value():
        return None  # not an integer either way: the schema says so
    plain = str(int(number)) if kind == "integer" else f"{number.normalize():f}"
    head = f"{where} is the string {value!r}"
    scientific = SCIENTIFIC.match(text)
    if not scientific or ("." in text and scientific.group(4)):  # YAML would read it unquoted
        return f"{head}: a number in quotes is text to YAML; write {plain} without quotes"
    if kind == "integer":
        return f"{head}: YAML reads {text} as text, and {where} takes an integer; write {plain}"
    sign, whole, fraction, exp_sign, exponent = scientific.groups()
    missing = " and ".join(
        part for part, absent in (("a dot", "." not in text), ("a sign in the exponent", not exp_sign)) if absent
    )
    spelt = f"{sign}{whole or '0'}.{fraction or '0'}e{exp_sign or '+'}{exponent}"
    return f"{head}: YAML reads {text} without {missing} as text; write {spelt} or {plain}"


def _walk(value, schema: dict, where: str) -> None:
    """Check ``value`` against ``schema`` and, for a mapping or a list, its keys or items (branches included)."""
    if not isinstance(schema, dict):
        return
    branches = [schema, *schema.get("oneOf", ()), *schema.get("anyOf", ())]
    if isinstance(value, str):
        types = {t for b in branches for t in _types(b)}
        kind = next((t for t in ("number", "integer") if t in types), None)
        if kind and "string" not in types and not any("enum" in b for b in branches):
            message = number_hint(where, value, kind)
            if message:
                raise KdpipeError(message)
        return
    if isinstance(value, float) and value.is_integer():  # JSON Schema takes 17.0 as an integer; the code does not
        types = {t for b in branches for t in _types(b)}
        if "integer" in types and "number" not in types:
            raise KdpipeError(f"{where}: {value} is not an integer; write {int(value)}")
    for branch in branches:
        if isinstance(value, dict):
            props = branch.get("properties", {})
            for key, item in value.items():
                if key in props:
                    _walk(item, props[key], f"{where}.{key}")
        elif isinstance(value, list) and isinstance(branch.get("items"), dict):
            for i, item in enumerate(value):
                _walk(item, branch["items"], f"{where}[{i}]")


def _types(schema: dict) -> list[str]:
    types = schema.get("type", [])
    return [types] if isinstance(types, str) else list(types)


def _default(props: dict, kind: str, key: str):
    return props.get(f"{kind}_defaults", {}).get("properties", {}).get(key, {}).get("default")


def _entries(config: dict, section: str):
    """(name, entry) of each entry of ``section``; an entry given as null stands for its defaults alone."""
    entries = config.get(section)
    for name, entry in entries.items() if isinstance(entries, dict) else ():
        if entry is None or isinstance(entry, dict):
            yield name, entry or {}


def _check_args(args, declared: dict, where: str) -> None:
    if not isinstance(args, dict):
        return
    for key, value in args.items():
        kind = declared.get(key)
        if kind and isinstance(value, str):
            message = number_hint(f"{where}.{key}", value, kind)
            if message:
                raise KdpipeError(message)


def _number_args(spec) -> dict:
    """The number-typed arguments ({name: schema type}) of a method or teacher objective (none without one)."""
    return {a.name: NUMBER_ARGS[a.type] for a in spec.args if a.type in NUMBER_ARGS} if spec else {}
