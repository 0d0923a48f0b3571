"""Hugging Face ``datasets`` as a dataset source: ``hf:NAME``, ``hf:NAME:CONFIG`` or a ``save_to_disk`` folder.

The ``datasets`` library reads; kdpipe maps its splits by name (:data:`SPLIT_NAMES`; an unlabelled split is split
off train instead) and ``ClassLabel`` ids to names, in their declared order (docs/your-own-models-and-data.md,
"Your own data").
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from kdpipe.core.store import KdpipeError
from kdpipe.data.transfer_sources import saved_dataset

# kdpipe split <- the names a Hugging Face dataset may give it, in order of preference
SPLIT_NAMES = {
    "train": ("train",),
    "validation": ("validation", "valid", "dev", "val"),
    "test": ("test",),
}


def is_hf_source(source: str) -> bool:
    """``hf:NAME[:CONFIG]``, or a local folder written by ``save_to_disk``."""
    return source.startswith("hf:") or (Path(source).is_dir() and saved_dataset(Path(source)))


def read_hf(
    source: str, label_column: str, optional_columns: list[str], roles: dict | None = None
) -> tuple[dict[str, pd.DataFrame], list]:
    """The splits of a Hugging Face dataset as raw tables ({kdpipe split: frame}, ``roles``: ``dataset.hf_splits``)
    and the names the label's ``ClassLabel`` declares (else empty); ``ClassLabel`` ids become names."""
    splits = load_splits(source)
    chosen = _choose_splits(source, splits, roles or {})
    if "train" not in chosen:
        raise KdpipeError(f"dataset.source {source}: no 'train' split; the dataset has splits {sorted(splits)}")
    ignored = sorted(set(splits) - set(chosen.values()))
    if ignored:
        print(f"[kdpipe] dataset.source {source}: splits {ignored} are not used", file=sys.stderr)
    tables, label_names = {}, []
    for split, name in chosen.items():
        data = splits[name]
        if label_column not in data.column_names:
            raise KdpipeError(
                f"dataset.source {source}: split '{name}' has no column '{label_column}' (dataset.label_column); "
                f"its columns are {data.column_names}"
            )
        frame = data.to_pandas()
        labels = frame[label_column]
        if ((labels.astype(str) == "-1") | labels.isna()).all():  # (as GLUE-style test splits mark them)
            if split == "train":
                raise KdpipeError(f"dataset.source {source}: the train split has no labels")
            print(
                f"[kdpipe] dataset.source {source}: split '{name}' has no labels (all -1 or empty); "
                f"{split} is split off train instead",
                file=sys.stderr,
            )
            continue
        for column in [label_column, *optional_columns]:
            feature = data.features.get(column)
            names = list(feature.names) if hasattr(feature, "int2str") and feature.names else []  # (a ClassLabel)
            if names:
                frame[column] = _to_names(frame[column], names, source, name, column)
                if column == label_column:
                    label_names = names
        tables[split] = frame
    return tables, label_names


def _choose_splits(source: str, splits: dict, roles: dict) -> dict[str, str]:
    """{kdpipe split: the dataset's split}: ``roles`` first, then the usual names of each role."""
    chosen = {}
    for split, names in SPLIT_NAMES.items():
        if split in roles:
            if roles[split] is None:
                continue
            if roles[split] not in splits:
                raise KdpipeError(
                    f"dataset.hf_splits.{split}: {source} has no split '{roles[split]}'; its splits are "
                    f"{sorted(splits)}"
                )
            chosen[split] = roles[split]
            continue
        name = next((n for n in names if n in splits and n not in roles.values()), None)
        if name is not None:
            chosen[split] = name
    if len(set(chosen.values())) < len(chosen):
        raise KdpipeError(f"dataset.hf_splits: one split of {source} plays two roles ({chosen})")
    return chosen


def load_splits(source: str, key: str = "dataset.source") -> dict:
    """{split name: ``datasets.Dataset``} (a single saved ``Dataset``: train); ``key``: the config key, for errors."""
    import datasets

    datasets.disable_progress_bars()
    try:
        if source.startswith("hf:"):
            name, _, config = source.removeprefix("hf:").partition(":")
            loaded = datasets.load_dataset(name, config or None)
        else:
            loaded = datasets.load_from_disk(source)
    except Exception as err:  # datasets raises many kinds (ConnectionError, FileNotFoundError, DatasetNotFoundError)
        first = str(err).splitlines()[0] if str(err) else ""
        raise KdpipeError(
            f"{key} {source}: cannot be loaded with the datasets library ({type(err).__name__}: {first}); "
            "a hub dataset needs a network or a copy in the local Hugging Face cache (HF_DATASETS_OFFLINE=1 uses "
            "the cache only), a folder must come from save_to_disk"
        ) from err
    if isinstance(loaded, datasets.Dataset):
        return {"train": loaded}
    return dict(loaded)


def _to_names(values: pd.Series, names: list[str], source: str, split: str, column: str) -> pd.Series:
    """Class names of a ``ClassLabel`` column (some versions of ``datasets`` decode them in ``to_pandas``)."""
    if not pd.api.types.is_integer_dtype(values):
        return values
    ids = values.to_numpy()
    bad = [v for v in ids if not 0 <= int(v) < len(names)]
    if bad:
        raise KdpipeError(
            f"dataset.source {source}: split '{split}' column '{column}' has class id {bad[0]}, outside its "
            f"ClassLabel's {len(names)} names ({len(bad)} such rows)"
        )
    return pd.Series([names[int(v)] for v in ids], index=values.index)
