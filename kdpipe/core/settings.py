"""Typed settings, read once at a stage's boundary (docs/design.md, "Style": settings read once).

:meth:`Settings.from_params` turns a job's JSON slice into the frozen dataclass its stage declares, refusing an
unknown key, a missing one or a value of the wrong type with one line naming it (the plan made the slice from the
same declarations, so any of these means plan and code disagree); :meth:`Settings.to_dict` gives back
exactly that slice. A field with a default is a key the plan may leave out; :func:`from_schema` takes that default
from the config schema. A method's ``method_args`` become :class:`Args`, read by attribute.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

from kdpipe.core.store import KdpipeError


def renamed(key: str, **kwargs) -> Any:
    """A field read from ``key`` of the slice (a key that is not a Python name, e.g. ``from``)."""
    return dataclasses.field(metadata={"key": key}, **kwargs)


@cache
def _schema() -> dict:
    import yaml

    from kdpipe import CONFIG_SCHEMA

    return yaml.safe_load(CONFIG_SCHEMA.read_text())


def _schema_node(*path: str) -> dict:
    node = _schema()
    for name in path:
        node = node["properties"][name]
    return node


def schema_default(*path: str) -> Any:
    """The config schema's default of the key at ``path`` (``"dataset", "split", "unlabelled"``)."""
    return _schema_node(*path)["default"]


def schema_completed(section: object, *path: str) -> dict:
    """A config section (at ``path`` in the schema, ``"dataset"``) completed with the schema's defaults, as the
    workflow completes a config: for a stage called by hand with only the keys it sets."""
    given = dict(section) if isinstance(section, Mapping) else {}
    out = {}
    for key, spec in _schema_node(*path).get("properties", {}).items():
        if key in given:
            value = given.pop(key)
        elif "default" in spec:
            value = spec["default"]
        else:
            continue
        nested = isinstance(value, Mapping) and "properties" in spec
        out[key] = schema_completed(value, *path, key) if nested else value
    return {**out, **given}  # (a key the schema does not know stays, for the reader to refuse)


def from_schema(*path: str) -> Any:
    """A field whose default is the config schema's (:func:`schema_default`), read only when a slice leaves it out."""
    return dataclasses.field(default_factory=lambda: schema_default(*path))


@dataclasses.dataclass(frozen=True)
class Settings:
    """The typed settings of a stage, or of a part of its slice; subclasses are frozen dataclasses."""

    @classmethod
    def from_params(cls, params: object, where: str = "") -> typing.Self:
        """The settings of the JSON object ``params`` (``where``: its name in messages)."""
        where = where or cls.__name__
        if not isinstance(params, Mapping):
            raise KdpipeError(f"{where}: expected an object of settings, got {_shown(params)}")
        fields = {_key(f): f for f in dataclasses.fields(cls) if f.init}
        unknown = [key for key in params if key not in fields]
        if unknown:
            close = difflib.get_close_matches(str(unknown[0]), fields, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KdpipeError(f"{where}: unknown key {unknown[0]!r}{hint}; the keys are {', '.join(fields)}")
        missing = [key for key, f in fields.items() if key not in params and not _optional(f)]
        if missing:
            raise KdpipeError(f"{where}: missing key {missing[0]!r}")
        hints = _hints(cls)
        made = cls(
            **{
                f.name: _convert(params[key], hints[f.name], f"{where}.{key}")
                for key, f in fields.items()
                if key in params
            }
        )
        object.__setattr__(made, "_given", tuple(params))
        return made

    def to_dict(self) -> dict:
        """The slice these settings were made from, key for key and in order (made otherwise: the keys off default)."""
        fields = {_key(f): f for f in dataclasses.fields(self)}
        given = getattr(self, "_given", None)
        if given is None:
            given = [key for key, f in fields.items() if not _optional(f) or getattr(self, f.name) != _default(f)]
        return {key: plain(getattr(self, fields[key].name)) for key in given}

    def canonical(self) -> str:
        """:meth:`to_dict` as the one JSON text a rule's ``params.cfg`` is (keys sorted)."""
        return json.dumps(self.to_dict(), sort_keys=True)


class Args:
    """A method's (or a teacher objective's) arguments, read-only, read by attribute (``args.temperature``; a name it
    does not have is an error naming it)."""

    __slots__ = ("_values", "_where")

    def __init__(self, values: Mapping, where: str = "method_args"):
        if not isinstance(values, Mapping):
            raise KdpipeError(f"{where}: expected an object of arguments, got {_shown(values)}")
        object.__setattr__(self, "_values", {str(k): freeze(v) for k, v in values.items()})
        object.__setattr__(self, "_where", where)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            known = ", ".join(self._values) or "none"
            raise KdpipeError(f"{self._where}: no argument {name!r} (it has {known})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._where} is read-only")

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Args) and self._values == other._values

    def __repr__(self) -> str:
        return f"Args({self.to_dict()!r})"

    def to_dict(self) -> dict:
        return {name: plain(value) for name, value in self._values.items()}


def freeze(value: Any) -> Any:
    """A JSON value made read-only: objects as mapping proxies, arrays as tuples."""
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def plain(value: Any) -> Any:
    """The JSON value of a setting (the inverse of :func:`freeze`, and of the typed settings)."""
    if isinstance(value, Settings | Args):
        return value.to_dict()
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def _key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def _optional(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


_hints = cache(typing.get_type_hints)


def _shown(value: Any) -> str:
    text = json.dumps(value, default=str)
    return f"{text if len(text) <= 60 else text[:57] + '...'} ({type(value).__name__})"


_SCALARS = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}


def _accepts(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of the JSON kind ``hint`` is made from (the arm of a union to convert it with)."""
    origin = typing.get_origin(hint) or hint
    if hint in (Any, object):
        return True
    if origin in _SCALARS:
        return isinstance(value, _SCALARS[origin]) and (origin is bool or not isinstance(value, bool))
    if origin is tuple:
        return isinstance(value, list | tuple)
    return isinstance(value, Mapping)  # a mapping, settings or arguments


def _convert(value: Any, hint: Any, where: str) -> Any:
    """``value`` checked against the type ``hint`` and made read-only (nested settings typed in turn)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(hint)
        if value is None and types.NoneType in arms:
            return None
        for arm in arms:
            if arm is not types.NoneType and _accepts(arm, value):
                return _convert(value, arm, where)
        raise KdpipeError(f"{where}: expected {_name(hint)}, got {_shown(value)}")
    if hint in (Any, object):
        return freeze(value)
    if not _accepts(hint, value):
        raise KdpipeError(f"{where}: expected {_name(hint)}, got {_shown(value)}")
    if origin is tuple:
        item = typing.get_args(hint)[0]
        return tuple(_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(hint, type) and issubclass(hint, Settings):
        return hint.from_params(value, where)
    if hint is Args:
        return Args(value, where)
    if origin is not None and issubclass(origin, Mapping):
        item = typing.get_args(hint)[1]
        return types.MappingProxyType({k: _convert(v, item, f"{where}.{k}") for k, v in value.items()})
    return value


def _name(hint: Any) -> str:
    """A type as a message says it."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if arm is types.NoneType else _name(arm) for arm in typing.get_args(hint))
    if origin is tuple:
        return f"a list of {_name(typing.get_args(hint)[0])}"
    if origin is not None and issubclass(origin, Mapping) or hint is Args:
        return "an object"
    if isinstance(hint, type) and issubclass(hint, Settings):
        return f"an object ({hint.__name__})"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a text"}.get(hint, str(hint))
