"""Write a public benchmark as a local ``save_to_disk`` folder, from a copy you already have or from the internet.

The benchmark configs (``experiments/glue_*.yaml`` and the others named in docs/experiments/benchmarks.md) name
their data as a user with internet does, ``hf:NAME:CONFIG``. Without internet, make the same rows from a copy you
already have and point the run at it:

    .venv/bin/python experiments/benchmarks/public_data.py mrpc --glue-dir ~/glue_data --out data/glue-mrpc
    .venv/bin/snakemake --profile profiles/cpu --configfile experiments/glue_mrpc.yaml data/glue-mrpc/source.yaml

``--glue-dir`` is the folder that GLUE's download script writes (``SST-2/``, ``MRPC/``, ``RTE/``, ``QNLI/``, each
with ``train.tsv``, ``dev.tsv`` and ``test.tsv``; ``--splits validation`` writes only the splits a config reads).
With ``--hub`` the rows come from the Hugging Face hub instead (a network is needed, once). Either way the folder
holds the splits, columns and ``ClassLabel`` names of the hub's ``nyu-mll/glue`` (test labels -1, as GLUE hides
them; kdpipe then splits its test rows off train), and ``source.yaml`` beside it sets ``dataset.source`` to the
folder, so the run reads exactly what the hub would give.

20 Newsgroups (``20newsgroups``), the 20-topic benchmark, comes as scikit-learn gives it
(``fetch_20newsgroups``: the "bydate" train and test sets, headers, signatures and quoted replies removed, as
scikit-learn advises for a realistic score), read either from the unpacked ``20news-bydate`` folder
(``--bydate-dir``, holding ``20news-bydate-train/`` and ``20news-bydate-test/``) or downloaded by scikit-learn
(``--sklearn``); posts that the cleaning leaves empty are dropped (kdpipe refuses empty texts). Rows in both cases
come in scikit-learn's unshuffled order (topic, then file name), so both give the same rows.

Amazon reviews in four domains (``amazon``), Blitzer et al.'s multi-domain sentiment set that Meta-KD uses (books,
dvd, electronics, kitchen; 1,000 positive and 1,000 negative reviews each), read from the unpacked
``sorted_data_acl`` folder (``--acl-dir``). The set has no split of its own: 20% of each domain's reviews of each
polarity are the test split (a fixed shuffle with seed 13), the rest train; ``--little kitchen=0.1`` keeps only that
share of one domain's training reviews, for the little-data case (the test split stays whole).

An external OOD set (``texts``): one split's text column of a folder written above, as a Parquet file for
``evaluate.ood.source`` (``--rows N``: N rows of a fixed shuffle, seed 13), e.g. SST-2's validation sentences as
far-OOD texts for a 20 Newsgroups run:

    .venv/bin/python experiments/benchmarks/public_data.py texts --from-dir data/glue-sst2 --split validation \
        --column sentence --out data/ood-sst2.parquet

It also writes ``data/ood-sst2.yaml``, which sets ``evaluate.ood.source`` to the file's absolute path: add it after
the configs, as ``source.yaml``, to run in another working directory.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path
from typing import NamedTuple


class GlueTask(NamedTuple):
    """A GLUE task: its folder, the hub's text columns and ClassLabel names, and the text and label columns of its
    .tsv files that map to them."""

    folder: str
    columns: list[str]
    names: list[str]
    tsv_columns: list[str]
    tsv_label: str


GLUE = {
    "sst2": GlueTask("SST-2", ["sentence"], ["negative", "positive"], ["sentence"], "label"),
    "mrpc": GlueTask(
        "MRPC", ["sentence1", "sentence2"], ["not_equivalent", "equivalent"], ["#1 String", "#2 String"], "Quality"
    ),
    "rte": GlueTask(
        "RTE", ["sentence1", "sentence2"], ["entailment", "not_entailment"], ["sentence1", "sentence2"], "label"
    ),
    "qnli": GlueTask(
        "QNLI", ["question", "sentence"], ["entailment", "not_entailment"], ["question", "sentence"], "label"
    ),
}
SPLITS = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
# the options that say where each task's rows come from (one of them is given)
SOURCES_OF = {
    "glue": ["glue_dir", "hub"],
    "20newsgroups": ["bydate_dir", "sklearn"],
    "amazon": ["acl_dir"],
    "texts": ["from_dir"],
}


def save(loaded, out: Path, what: str) -> None:
    """Write ``loaded`` (a DatasetDict) to the folder ``out`` and ``source.yaml`` beside its splits, which points
    ``dataset.source`` at it."""
    if out.exists() and not out.is_dir():
        sys.exit(f"--out {out} is a file; give a folder to write the dataset in")
    loaded.save_to_disk(str(out))
    (out / "source.yaml").write_text(
        f"# written by experiments/benchmarks/public_data.py: {what}\ndataset:\n  source: {out.resolve()}\n"
    )
    sizes = ", ".join(f"{split} {len(rows)}" for split, rows in loaded.items())
    print(f"{out}: {what} ({sizes}); add {out / 'source.yaml'} after the experiment's --configfile")


def read_tsv(path: Path, required: list[str] = ()) -> list[dict]:
    """A GLUE .tsv as its header says, read without quoting (sentences hold unbalanced quotes). A file without the
    ``required`` columns in its header, or without a data row, exits naming the file and what is wrong."""
    csv.field_size_limit(sys.maxsize)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = reader.fieldnames
        if not header:
            sys.exit(f"{path}: the file is empty (not even a header)")
        missing = [column for column in required if column not in header]
        if missing:
            sys.exit(
                f"{path}: its header has no column {', '.join(map(repr, missing))}; it has {header}, and this "
                f"GLUE file needs {list(required)}: is it another task's file, or another version of GLUE?"
            )
        rows = list(reader)
    if not rows:
        sys.exit(f"{path}: no data rows (only a header); the split would be empty")
    return rows


def glue_rows(task: str, folder: Path, split: str) -> dict[str, list]:
    """One split of a GLUE task in the hub's columns: the texts, ``label`` (-1 where GLUE hides it) and ``idx``.
    A file without the task's columns or without a data row, a row with a missing text or a label that is not one of
    the task's exits naming the file (and the row)."""
    _, columns, names, text_columns, label_column = GLUE[task]
    path = folder / SPLITS[split]
    rows = read_tsv(path, [*text_columns, *([label_column] if split != "test" else [])])
    out: dict[str, list] = {c: [] for c in [*columns, "label", "idx"]}
    for i, row in enumerate(rows):
        where = f"{path}: data row {i + 1}"
        header = [key for key in row if key is not None]
        fields = [row[key] for key in header if row[key] is not None] + list(row.get(None) or [])
        if len(fields) != len(header):
            sys.exit(f"{where} has {len(fields)} tab-separated fields, its header {len(header)}")
        texts = [row[column] for column in text_columns]
        label = row.get(label_column)
        if split == "test":
            label_id = -1
        elif label in names:
            label_id = names.index(label)
        elif label is not None and label.isdigit() and int(label) < len(names):
            label_id = int(label)
        else:
            sys.exit(f"{where}: label {label!r} is not one of {', '.join(names)} (or 0-{len(names) - 1})")
        for column, text in zip(columns, texts, strict=True):
            out[column].append(text)
        out["label"].append(label_id)
        out["idx"].append(int(row["index"]) if "index" in row and row["index"].isdigit() else i)
    return out


def write_glue(task: str, glue_dir: Path | None, out: Path, splits: list[str] | None = None) -> None:
    """GLUE ``task`` from ``glue_dir`` (None: the hub) as a ``save_to_disk`` folder; ``splits``: only these."""
    import datasets

    subfolder, columns, names, _, _ = GLUE[task]
    splits = splits or list(SPLITS)
    if glue_dir is None:
        loaded = datasets.load_dataset("nyu-mll/glue", task)
        loaded = datasets.DatasetDict({split: loaded[split] for split in splits})
    else:
        features = datasets.Features(
            {
                **{c: datasets.Value("string") for c in columns},
                "label": datasets.ClassLabel(names=names),
                "idx": datasets.Value("int32"),
            }
        )
        folder = glue_dir / subfolder
        missing = [SPLITS[split] for split in splits if not (folder / SPLITS[split]).is_file()]
        if missing:
            sys.exit(
                f"{folder}: no {', '.join(missing)}; --glue-dir is the folder holding {subfolder}/ "
                "(--splits names the splits to write, when a config reads only some)"
            )
        loaded = datasets.DatasetDict(
            {split: datasets.Dataset.from_dict(glue_rows(task, folder, split), features=features) for split in splits}
        )
    save(loaded, out, f"GLUE {task}")


def newsgroups_rows(split_dir: Path, tabs_are_newlines: bool = False) -> tuple[list[str], list[int], list[str]]:
    """(texts, label ids, topic names) of one bydate folder, in scikit-learn's order, cleaned as
    ``fetch_20newsgroups(remove=("headers", "footers", "quotes"))`` cleans them. ``tabs_are_newlines``: a copy
    that stores each post on one line, its line breaks written as tabs (the cleaning needs the line breaks)."""
    from sklearn.datasets._twenty_newsgroups import (
        strip_newsgroup_footer,
        strip_newsgroup_header,
        strip_newsgroup_quoting,
    )

    topics = sorted(p.name for p in split_dir.iterdir() if p.is_dir())
    texts, labels = [], []
    for label, topic in enumerate(topics):
        posts = [p for p in (split_dir / topic).iterdir() if p.name.isdigit()]  # posts are named by number
        for path in sorted(posts, key=lambda p: p.name):
            text = path.read_text(encoding="latin-1")
            if tabs_are_newlines:
                text = text.replace("\t", "\n")
            texts.append(strip_newsgroup_quoting(strip_newsgroup_footer(strip_newsgroup_header(text))))
            labels.append(label)
    return texts, labels, topics


def write_newsgroups(bydate_dir: Path | None, out: Path, tabs_are_newlines: bool = False) -> None:
    import datasets

    splits, names = {}, None
    for split in ("train", "test"):
        if bydate_dir is None:
            from sklearn.datasets import fetch_20newsgroups

            bunch = fetch_20newsgroups(subset=split, shuffle=False, remove=("headers", "footers", "quotes"))
            texts, labels, topics = list(bunch.data), [int(t) for t in bunch.target], list(bunch.target_names)
        else:
            folder = bydate_dir / f"20news-bydate-{split}"
            if not folder.is_dir():
                sys.exit(f"{folder}: not found; --bydate-dir is the folder holding 20news-bydate-{split}/")
            texts, labels, topics = newsgroups_rows(folder, tabs_are_newlines)
        names = names or topics
        kept = [i for i, text in enumerate(texts) if text.strip()]  # posts the cleaning left empty (quotes only)
        print(f"20 Newsgroups {split}: {len(texts) - len(kept)} posts empty after cleaning, dropped")
        texts, labels = [texts[i] for i in kept], [labels[i] for i in kept]
        features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})
        splits[split] = datasets.Dataset.from_dict({"text": texts, "label": labels}, features=features)
    loaded = datasets.DatasetDict(splits)
    save(loaded, out, "20 Newsgroups")


ACL_DOMAINS = {"books": "books", "dvd": "dvd", "electronics": "electronics", "kitchen": "kitchen_&_housewares"}
REVIEW_TEXT = re.compile(r"<review_text>\s*(.*?)\s*</review_text>", re.S)


def acl_reviews(path: Path) -> list[str]:
    """The review texts of one ``.review`` file (pseudo-XML, not well-formed: read with a pattern)."""
    return REVIEW_TEXT.findall(path.read_text(encoding="latin-1"))


def write_amazon(acl_dir: Path, out: Path, little: dict[str, float]) -> None:
    import datasets
    import numpy as np

    unknown = sorted(set(little) - set(ACL_DOMAINS))
    if unknown:
        sys.exit(f"--little: no domain {unknown}; the domains are {sorted(ACL_DOMAINS)}")
    names = ["negative", "positive"]
    rows: dict[str, dict[str, list]] = {s: {"text": [], "label": [], "domain": []} for s in ("train", "test")}
    rng = np.random.default_rng(13)
    for domain, folder in ACL_DOMAINS.items():
        for label, polarity in enumerate(names):
            path = acl_dir / folder / f"{polarity}.review"
            if not path.is_file():
                sys.exit(f"{path}: not found; --acl-dir is the unpacked sorted_data_acl folder")
            texts = acl_reviews(path)
            order = rng.permutation(len(texts))
            cut = len(texts) // 5
            train = order[cut:][: int(round(little.get(domain, 1.0) * (len(texts) - cut)))]
            for split, picks in (("test", sorted(order[:cut])), ("train", sorted(train))):
                rows[split]["text"] += [texts[i] for i in picks]
                rows[split]["label"] += [label] * len(picks)
                rows[split]["domain"] += [domain] * len(picks)
    string = datasets.Value("string")
    features = datasets.Features({"text": string, "label": datasets.ClassLabel(names=names), "domain": string})
    loaded = datasets.DatasetDict({s: datasets.Dataset.from_dict(r, features=features) for s, r in rows.items()})
    save(loaded, out, "Amazon reviews")


def write_texts(folder: Path, split: str, column: str, rows: int | None, out: Path) -> None:
    """``split``'s ``column`` of the ``save_to_disk`` folder ``folder`` as a Parquet file with one column, ``text``
    (``rows``: that many rows of a fixed shuffle, seed 13; all when None), and ``out`` with ``.yaml`` for
    ``.parquet``, which sets ``evaluate.ood.source`` to it. Empty and missing texts are dropped and counted."""
    import datasets
    import numpy as np
    import pandas as pd

    if not (folder / "dataset_dict.json").is_file():
        sys.exit(f"{folder}: not a folder of splits written by save_to_disk (no dataset_dict.json)")
    loaded = datasets.load_from_disk(str(folder))
    if split not in loaded:
        sys.exit(f"{folder}: no split {split!r}; it has {sorted(loaded)}")
    if column not in loaded[split].column_names:
        sys.exit(f"{folder} {split}: no column {column!r}; it has {loaded[split].column_names}")
    feature = loaded[split].features[column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        sys.exit(f"{folder} {split}: column {column!r} holds {feature}, not text")
    texts = loaded[split][column]
    if rows is not None and rows < len(texts):
        texts = [texts[i] for i in sorted(np.random.default_rng(13).permutation(len(texts))[:rows])]
    kept = [text for text in texts if text is not None and text.strip()]
    if not kept:
        sys.exit(f"{folder} {split}: every text of {column!r} is empty")
    out.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"text": kept}).to_parquet(out, index=False)
    settings = out.with_suffix(".yaml")
    settings.write_text(
        f"# written by experiments/benchmarks/public_data.py: {folder} {split} ({column}) as OOD texts\n"
        f"evaluate:\n  ood: {{source: {out.resolve()}}}\n"
    )
    empty = f" ({len(texts) - len(kept)} empty dropped)" if len(kept) < len(texts) else ""
    print(f"{out}: {len(kept):,} texts of {folder} {split} ({column}){empty}; add {settings} after the configs")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=[*sorted(GLUE), "20newsgroups", "amazon", "texts"])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--glue-dir", type=Path, help="GLUE tasks: a GLUE folder as GLUE's download script writes it")
    where.add_argument("--hub", action="store_true", help="GLUE tasks: download nyu-mll/glue from the hub")
    where.add_argument("--bydate-dir", type=Path, help="20newsgroups: the unpacked 20news-bydate folder")
    where.add_argument("--sklearn", action="store_true", help="20newsgroups: let scikit-learn download it")
    where.add_argument("--acl-dir", type=Path, help="amazon: the unpacked sorted_data_acl folder")
    where.add_argument("--from-dir", type=Path, help="texts: a save_to_disk folder (one this script wrote)")
    parser.add_argument("--out", type=Path, required=True, help="the save_to_disk folder (texts: file) to write")
    parser.add_argument(
        "--splits",
        nargs="+",
        choices=list(SPLITS),
        help="GLUE tasks: write only these splits (default: train validation test)",
    )
    parser.add_argument("--split", default="validation", help="texts: the split to read (default: validation)")
    parser.add_argument("--column", default="text", help="texts: the text column to read (default: text)")
    parser.add_argument("--rows", type=int, help="texts: keep this many rows of a fixed shuffle (default: all)")
    parser.add_argument(
        "--tabs-are-newlines",
        action="store_true",
        help="20newsgroups: the copy stores each post on one line with tabs for its line breaks",
    )
    parser.add_argument(
        "--little",
        action="append",
        default=[],
        metavar="DOMAIN=SHARE",
        help="amazon: keep only this share of one domain's training reviews (the little-data case)",
    )
    args = parser.parse_args(argv)
    task = "glue" if args.task in GLUE else args.task
    if args.splits and task != "glue":
        parser.error(f"--splits is for GLUE tasks, not {args.task}")
    given = next(flag for flags in SOURCES_OF.values() for flag in flags if getattr(args, flag))
    if given not in SOURCES_OF[task]:
        wanted = " or ".join(f"--{flag.replace('_', '-')}" for flag in SOURCES_OF[task])
        parser.error(f"{args.task} comes from {wanted}, not --{given.replace('_', '-')}")
    if args.task == "texts":
        if args.out.suffix != ".parquet":
            parser.error(f"texts writes a Parquet file: --out {args.out} must end in .parquet")
        if args.rows is not None and args.rows < 1:
            parser.error(f"--rows {args.rows}: keep at least one row")
        write_texts(args.from_dir, args.split, args.column, args.rows, args.out)
    elif args.task == "amazon":
        little = {}
        for item in args.little:
            domain, _, share = item.partition("=")
            little[domain] = float(share)
        write_amazon(args.acl_dir, args.out, little)
    elif args.task == "20newsgroups":
        write_newsgroups(None if args.sklearn else args.bydate_dir, args.out, args.tabs_are_newlines)
    else:
        write_glue(args.task, None if args.hub else args.glue_dir, args.out, args.splits)


if __name__ == "__main__":
    main()
