"""Write a public benchmark as a local ``save_to_disk`` folder, for a machine without internet.

The benchmark configs (``experiments/glue_*.yaml`` and the others named in docs/experiments/benchmarks.md) name
their data as a user with internet does, ``hf:NAME:CONFIG``. Without internet, make the same rows from a copy you
already have and point the run at it:

    .venv/bin/python experiments/benchmarks/public_data.py mrpc --glue-dir ~/glue_data --out data/glue-mrpc
    .venv/bin/snakemake --profile profiles/cpu --configfile experiments/glue_mrpc.yaml data/glue-mrpc/source.yaml

``--glue-dir`` is the folder that GLUE's download script writes (``SST-2/``, ``MRPC/``, ``RTE/``, each with
``train.tsv``, ``dev.tsv`` and ``test.tsv``). With ``--hub`` the rows come from the Hugging Face hub instead (a
network is needed, once). Either way the folder holds the splits, columns and ``ClassLabel`` names of the hub's
``nyu-mll/glue`` (test labels -1, as GLUE hides them; kdpipe then splits its test rows off train), and
``source.yaml`` beside it sets ``dataset.source`` to the folder, so the run reads exactly what the hub would give.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

# task -> (GLUE folder, text columns of the hub's copy, ClassLabel names, how a GLUE .tsv row maps to them)
GLUE = {
    "sst2": ("SST-2", ["sentence"], ["negative", "positive"]),
    "mrpc": ("MRPC", ["sentence1", "sentence2"], ["not_equivalent", "equivalent"]),
    "rte": ("RTE", ["sentence1", "sentence2"], ["entailment", "not_entailment"]),
}
SPLITS = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}


def read_tsv(path: Path) -> list[dict]:
    """A GLUE .tsv as its header says, read without quoting (sentences hold unbalanced quotes)."""
    csv.field_size_limit(sys.maxsize)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))


def glue_rows(task: str, folder: Path, split: str) -> dict[str, list]:
    """One split of a GLUE task in the hub's columns: the texts, ``label`` (-1 where GLUE hides it) and ``idx``."""
    _, columns, names = GLUE[task]
    rows = read_tsv(folder / SPLITS[split])
    out: dict[str, list] = {c: [] for c in [*columns, "label", "idx"]}
    for i, row in enumerate(rows):
        if task == "sst2":
            texts = [row["sentence"]]
            label = row.get("label")
        elif task == "mrpc":
            texts = [row["#1 String"], row["#2 String"]]
            label = row.get("Quality")
        else:  # rte
            texts = [row["sentence1"], row["sentence2"]]
            label = row.get("label")
        if split == "test":
            label_id = -1
        elif label in names:
            label_id = names.index(label)
        else:
            label_id = int(label)
        for column, text in zip(columns, texts, strict=True):
            out[column].append(text)
        out["label"].append(label_id)
        out["idx"].append(int(row["index"]) if "index" in row and row["index"].isdigit() else i)
    return out


def write_glue(task: str, glue_dir: Path | None, out: Path) -> None:
    import datasets

    subfolder, columns, names = GLUE[task]
    if glue_dir is None:
        loaded = datasets.load_dataset("nyu-mll/glue", task)
    else:
        features = datasets.Features(
            {
                **{c: datasets.Value("string") for c in columns},
                "label": datasets.ClassLabel(names=names),
                "idx": datasets.Value("int32"),
            }
        )
        folder = glue_dir / subfolder
        missing = [name for name in SPLITS.values() if not (folder / name).is_file()]
        if missing:
            sys.exit(f"{folder}: no {', '.join(missing)}; --glue-dir is the folder holding {subfolder}/")
        loaded = datasets.DatasetDict(
            {split: datasets.Dataset.from_dict(glue_rows(task, folder, split), features=features) for split in SPLITS}
        )
    loaded.save_to_disk(str(out))
    (out / "source.yaml").write_text(
        f"# written by experiments/benchmarks/public_data.py: the hub's nyu-mll/glue {task}, read from disk\n"
        f"dataset:\n  source: {out.resolve()}\n"
    )
    sizes = ", ".join(f"{split} {len(rows)}" for split, rows in loaded.items())
    print(f"{out}: GLUE {task} ({sizes}); add {out / 'source.yaml'} after the experiment's --configfile")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(GLUE))
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--glue-dir", type=Path, help="a GLUE folder as GLUE's download script writes it")
    where.add_argument("--hub", action="store_true", help="download nyu-mll/glue from the Hugging Face hub")
    parser.add_argument("--out", type=Path, required=True, help="the save_to_disk folder to write")
    args = parser.parse_args(argv)
    write_glue(args.task, None if args.hub else args.glue_dir, args.out)


if __name__ == "__main__":
    main()
