"""Cell values and labels as the prepare stage reads them (docs/your-own-models-and-data.md, "Your own data").

A cell must hold a single value; numbers in the label, domain and id columns become text without a float's ``.0``;
labels that are one class written differently stop the run unless ``dataset.normalize_labels`` merges them.
"""

from __future__ import annotations

import math
import re
import sys
from collections import Counter
from decimal import Decimal

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError

NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d{1,2})?$")
# What each column's values are, for the message that refuses a list or an object in it.
_PLURAL = {"text": "texts", "text_pair": "second texts", "label": "labels", "domain": "domains", "id": "ids"}
# Columns whose numbers are labels or names: a whole float is written as an integer there.
NUMERIC_NAME_COLUMNS = ("label", "domain", "id")
_SHOWN_GROUPS = 5


def check_scalars(values: pd.Series, name: str, column: str, key: str, where: str) -> None:
    """Refuse a list, array or mapping in a cell of a configured column, naming the first such row."""
    if values.dtype != object:
        return
    kinds = values.map(container)
    bad = np.flatnonzero(kinds.notna().to_numpy())
    if len(bad):
        more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
        raise KdpipeError(
            f"{where}: data row {bad[0] + 1} (counting from 1) has {kinds.iloc[bad[0]]} in column '{column}' "
            f"(dataset.{key}){more}; {_PLURAL.get(name, name + 's')} must be single values"
        )


def container(value) -> str | None:
    """What a cell holds that is no single value (a list, an object), or None."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple, set, frozenset, np.ndarray)):
        return "a list"
    return None


def cell_texts(values: pd.Series, whole_floats: bool) -> np.ndarray | pd.api.extensions.ExtensionArray:
    """The cells as strings; with ``whole_floats``, a column of floats only writes its whole numbers as integers
    (``1.0`` -> ``1``); a column that mixes spellings keeps each as written (:func:`check_or_merge` catches them)."""
    if whole_floats and pd.api.types.is_float_dtype(values.dtype):
        return np.array([_text(value) for value in values], dtype=object)
    return values.astype(str).array  # (pandas' strings: not one Python object per cell, memory flat in N)


def _text(value) -> str:
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    return str(value)


def number_text(label: str) -> str | None:
    """A decimal number label written canonically (``1.0``, ``01``, ``1e0`` -> ``1``; ``0.50`` -> ``0.5``), or None."""
    if not NUMBER.match(label):
        return None
    number = Decimal(label)  # (the pattern admits only valid decimals)
    if number == number.to_integral_value():
        return str(int(number))
    return format(number.normalize(), "f")


def _merged_spelling(label: str) -> str:
    """Steps 1-2 of the merge: trimmed, and a number written canonically."""
    trimmed = label.strip()
    return number_text(trimmed) or trimmed


def check_or_merge(
    tables: dict[str, pd.DataFrame], declared: list[str], normalize: bool, where: str, column: str
) -> tuple[dict[str, pd.DataFrame], list[str], dict[str, dict[str, int]] | None]:
    """Stop on labels that are one class written differently, or merge them (``normalize``): the tables, the declared
    order mapped through the merge, and the merges ({label: {spelling: rows}}; None without ``normalize``)."""
    counts = Counter()
    for table in tables.values():
        counts.update(table["label"].value_counts().to_dict())
    groups: dict[str, dict[str, int]] = {}
    for label in sorted(counts):
        groups.setdefault(_merged_spelling(label).casefold(), {})[label] = counts[label]
    clashes = [group for group in groups.values() if len(group) > 1]
    if not normalize:
        if clashes:
            shown = "; ".join(_describe(group) for group in clashes[:_SHOWN_GROUPS])
            more = f"; and {len(clashes) - _SHOWN_GROUPS} more groups" if len(clashes) > _SHOWN_GROUPS else ""
            raise KdpipeError(
                f"{where}: column '{column}' (dataset.label_column) has labels that are one class written "
                f"differently (equal after trimming spaces, ignoring case, or as numbers): {shown}{more}; set "
                "dataset.normalize_labels: true to merge each group into one label, or make the labels consistent"
            )
        return tables, declared, None
    final, merges = {}, {}
    for group in groups.values():
        spellings = Counter()
        for label, rows in group.items():
            spellings[_merged_spelling(label)] += rows
        chosen = min(spellings, key=lambda spelling: (-spellings[spelling], spelling))
        final.update({label: chosen for label in group})
        if any(label != chosen for label in group):
            merges[chosen] = dict(group)
    if merges:
        tables = {origin: table.assign(label=table["label"].map(final)) for origin, table in tables.items()}
        declared = list(dict.fromkeys(final.get(label, label) for label in declared))
        described = "; ".join(
            f"{_describe({s: r for s, r in group.items() if s != label})} -> {label!r} ({sum(group.values())} rows "
            "in all)"
            for label, group in merges.items()
        )
        print(f"[kdpipe] dataset.normalize_labels: merged {described}", file=sys.stderr)
    return tables, declared, merges


def _describe(group: dict[str, int]) -> str:
    return ", ".join(f"{label!r} ({rows} row{'s' if rows != 1 else ''})" for label, rows in group.items())
