"""Duplicate texts with conflicting labels, found across all of a dataset's files before anything else is done
with them (docs/your-own-models-and-data.md, "Your own data").

Texts are compared folded (:func:`kdpipe.data.folding.text_hashes`); ``dataset.conflicts`` drops every copy, keeps
the ``majority`` label or stops with an ``error``. What was found goes to the manifest (``conflicting_duplicates``)
and, with examples, to the prepare log.
"""

from __future__ import annotations

import sys

import pandas as pd

from kdpipe.core.store import KdpipeError
from kdpipe.data.folding import text_hashes

POLICIES = ("drop", "majority", "error")


def resolve_conflicts(tables: dict[str, pd.DataFrame], policy: str) -> tuple[dict[str, pd.DataFrame], dict]:
    """The tables with conflicting copies dropped or relabelled as ``policy`` says, and what was found."""
    if policy not in POLICIES:  # (also for a stage run by hand, whose settings no schema checked)
        raise KdpipeError(f"dataset.conflicts is {policy!r}; expected one of {', '.join(POLICIES)}")
    keys = ["text", "text_pair"] if "text_pair" in tables["train"] else ["text"]
    hashes = {origin: text_hashes(table, keys) for origin, table in tables.items()}
    rows = pd.concat(
        [table[keys + ["label"]].assign(key=hashes[origin]) for origin, table in tables.items()], ignore_index=True
    )
    copies = rows.groupby(["key", "label"], sort=False).size().rename("copies").reset_index()
    conflicting = copies[copies.groupby("key", sort=False)["label"].transform("nunique") > 1]
    if conflicting.empty:
        return tables, {}
    texts = {key: group for key, group in conflicting.groupby("key", sort=False)}
    shown = rows.drop_duplicates("key").set_index("key")["text"]  # each text as first written
    examples = [_describe(shown[key], group) for key, group in list(texts.items())[:3]]
    if policy == "error":
        raise KdpipeError(
            f"dataset: {len(texts)} texts appear with different labels, e.g. {'; '.join(examples)}; fix the data, or "
            "set dataset.conflicts: drop (every copy) or majority"
        )
    winners = {key: _majority(shown[key], group) for key, group in texts.items()} if policy == "majority" else {}
    out, changed = {}, {}
    for origin, table in tables.items():
        key = pd.Series(hashes[origin], index=table.index)
        hit = key.isin(set(texts))
        if policy == "drop":
            changed[origin] = int(hit.sum())
            out[origin] = table[~hit]
        else:
            relabelled = table["label"].where(~hit, key.map(winners))
            changed[origin] = int((relabelled != table["label"]).sum())
            out[origin] = table.assign(label=relabelled)
    verb = "dropped" if policy == "drop" else "relabelled"
    each = ", ".join(f"{n:,} of {origin}" for origin, n in changed.items() if n) or "none"
    print(
        f"[kdpipe] dataset: {len(texts)} texts appear with different labels, compared folded ({policy}: "
        f"{sum(changed.values())} rows {verb}: {each}), e.g. {'; '.join(examples)}",
        file=sys.stderr,
    )
    return out, {
        "texts": len(texts),
        "policy": policy,
        f"rows_{verb}": sum(changed.values()),
        "by_split": changed,
        "examples": examples,
    }


def _describe(text: str, group: pd.DataFrame) -> str:
    return f"{text[:60]!r} labelled " + ", ".join(f"{row.label} x{row.copies}" for row in group.itertuples())


def _majority(text: str, group: pd.DataFrame) -> str:
    top = group[group["copies"] == group["copies"].max()]
    if len(top) > 1:
        raise KdpipeError(f"dataset.conflicts majority: {_describe(text, group)} has no majority label; fix the data")
    return top["label"].iloc[0]
