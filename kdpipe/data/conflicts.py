"""Duplicate texts with conflicting labels, found across all of a dataset's files before anything else is done
with them (docs/your-own-models-and-data.md, "Your own data").

``dataset.conflicts``: ``drop`` every copy of such a text (the default: nobody can say which label is right),
keep the ``majority`` label (a tie is an error), or stop with an ``error``. What was found goes to the dataset
manifest (``conflicting_duplicates``) and, with examples, to the prepare log.
"""

from __future__ import annotations

import sys

import pandas as pd

from kdpipe.core.store import KdpipeError

POLICIES = ("drop", "majority", "error")


def resolve_conflicts(tables: dict[str, pd.DataFrame], policy: str) -> tuple[dict[str, pd.DataFrame], dict]:
    """The tables with conflicting copies dropped or relabelled as ``policy`` says, and what was found ({} when
    nothing conflicts)."""
    if policy not in POLICIES:
        raise KdpipeError(f"dataset.conflicts is {policy!r}; expected one of {', '.join(POLICIES)}")
    keys = ["text", "text_pair"] if "text_pair" in tables["train"] else ["text"]
    copies = pd.concat(list(tables.values())).groupby(keys + ["label"], sort=False).size().rename("copies")
    copies = copies.reset_index()
    conflicting = copies[copies.groupby(keys, sort=False)["label"].transform("nunique") > 1]
    if conflicting.empty:
        return tables, {}
    # grouped by a list of columns, pandas names each group by a tuple, also for one column
    texts = {(k[0] if len(keys) == 1 else k): g for k, g in conflicting.groupby(keys, sort=False)}
    examples = [_describe(key, group) for key, group in list(texts.items())[:3]]
    if policy == "error":
        raise KdpipeError(
            f"dataset: {len(texts)} texts appear with different labels, e.g. {'; '.join(examples)}; fix the data, or "
            "set dataset.conflicts: drop (every copy) or majority"
        )
    winners = {key: _majority(key, group) for key, group in texts.items()} if policy == "majority" else {}
    out, dropped = {}, 0
    for origin, table in tables.items():
        key = table[keys[0]] if len(keys) == 1 else pd.Series(list(zip(*(table[k] for k in keys))), index=table.index)
        hit = key.isin(set(texts))
        if policy == "drop":
            dropped += int(hit.sum())
            out[origin] = table[~hit]
        else:
            out[origin] = table.assign(label=table["label"].where(~hit, key.map(winners)))
    print(
        f"[kdpipe] dataset: {len(texts)} texts appear with different labels ({policy}: {dropped} rows dropped), "
        f"e.g. {'; '.join(examples)}",
        file=sys.stderr,
    )
    return out, {"texts": len(texts), "policy": policy, "rows_dropped": dropped, "examples": examples}


def _describe(key, group: pd.DataFrame) -> str:
    text = key if isinstance(key, str) else key[0]
    return f"{text[:60]!r} labelled " + ", ".join(f"{row.label} x{row.copies}" for row in group.itertuples())


def _majority(key, group: pd.DataFrame) -> str:
    top = group[group["copies"] == group["copies"].max()]
    if len(top) > 1:
        raise KdpipeError(f"dataset.conflicts majority: {_describe(key, group)} has no majority label; fix the data")
    return top["label"].iloc[0]
