"""The transfer rows' evaluation filter at a million rows: the words rule (kdpipe.data.contamination: 13 consecutive
words shared with an evaluation text, or a shorter one contained whole, beside whole texts and the max_length
prefix) against the former filter of whole texts and prefixes alone, on the same rows, in one run.

The evaluation texts are the default run's (config.yaml: BBC News, validation 10% and test 20%, seed 13: 637
articles). The transfer file holds ``--rows`` rows made of BBC News training-split sentences, shuffled and re-joined
(3 to 7 sentences a row, seeded), of which ``--planted`` are validation or test articles planted in seven ways, in
turn: behind a source line, inside a quotation, before a credit line, inside another row, in capitals behind a
label, its first half before other text, two of them one after the other (each kind takes the articles in a
shuffled order of its own, so no planted row repeats another). Each side is pass 1 of the ``transfer`` job, reading
the file in batches through kdpipe's readers (``kdpipe.data.text_readers``) with the smallest max_length of
config.yaml's models (96: a 94-character prefix): the new side is ``kdpipe.data.transfer._reasons``; the old side is
that function as it was before the words rule (``_old_reasons`` below: the same steps, without the log line and the
name given to a source listed twice). Each runs in a fresh Python process of its own (Arrow allocating with the C
library's malloc, as in a job started from the command line), for its wall time, its CPU time (less sensitive than
the wall time to other work on the machine) and its peak resident memory (``VmHWM``, from the pass's start; the
resident memory before the pass, after the imports, is given too).

Checks: every planted row is dropped by the new side; a sample of the generated (not planted) rows that the words
rule dropped, and of those it kept, is read again by a plain Python version of the rule (lower-cased words of the
folded text, 13-word tuples), which must agree; and how many training sentences of 13 words or more share a 13-gram
with a validation or test article (the generated rows are made of them).

    nice .venv/bin/python benchmarks/decontamination.py                          # 10^6 rows, 1,000 planted
    .venv/bin/python benchmarks/decontamination.py --rows 20000 --planted 70     # a smoke test (about a minute)

Prints a Markdown table and appends a JSON record to benchmarks/out/decontamination.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

KINDS = ("source line", "quotation", "credit line", "inside a row", "capitals", "first half", "two articles")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="transfer rows, planted ones included")
    p.add_argument("--planted", type=int, default=1000, help="rows that hold a validation or test article")
    p.add_argument("--max-length", type=int, default=96, help="the smallest max_length of the run's models")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sample", type=int, default=300, help="rows of each outcome checked in plain Python")
    p.add_argument("--child", choices=("old", "new"), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--file", help=argparse.SUPPRESS)
    p.add_argument("--reasons", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    import torch  # (the parent only: the record names the device; the passes run torch-free)
    from bench_common import BBC, record

    from kdpipe.data.dataset import read_split
    from kdpipe.data.prepare import prepare
    from kdpipe.data.settings import DatasetSettings

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare(DatasetSettings.of_section(BBC), tmp / "data")
        splits = {split: read_split(tmp / "data", split)["text"].tolist() for split in ("train", "validation", "test")}
        started = time.perf_counter()
        planted = generate(splits, args, tmp / "transfer.parquet")
        made = time.perf_counter() - started
        size = (tmp / "transfer.parquet").stat().st_size
        print(f"generated {args.rows:,} rows ({size / 1e6:,.0f} MB of parquet) in {made:.0f} s", file=sys.stderr)
        sides = {}
        for side in ("old", "new"):
            out = tmp / f"{side}.npy"
            command = [sys.executable, __file__, "--child", side, "--data", str(tmp / "data")]
            command += ["--file", str(tmp / "transfer.parquet"), "--reasons", str(out), "--max-length"]
            result = subprocess.run([*command, str(args.max_length)], capture_output=True, text=True)
            if result.returncode:
                sys.exit(f"the {side} side failed:\n{result.stderr[-3000:]}")
            sides[side] = json.loads(result.stdout.strip().splitlines()[-1]) | {"reason": np.load(out)}
            done = sides[side]
            print(f"{side}: {done['seconds']:.1f} s ({done['cpu_seconds']:.1f} s CPU), peak {done['peak_mb']:,.0f} MB")
        checked = check(splits, tmp / "transfer.parquet", planted, sides["new"], args)
    old, new = sides["old"], sides["new"]
    fields = {
        "rows": args.rows,
        "planted": int((planted >= 0).sum()),
        "max_length": args.max_length,
        "evaluation_texts": len(splits["validation"]) + len(splits["test"]),
        "parquet_mb": round(size / 1e6, 1),
        "old": summary(old, planted, OLD_REASONS),
        "new": summary(new, planted, NEW_REASONS),
        "time_ratio_new_to_old": round(new["seconds"] / old["seconds"], 3),
        "cpu_time_ratio_new_to_old": round(new["cpu_seconds"] / old["cpu_seconds"], 3),
        "load_average": list(os.getloadavg()),
        "peak_ratio_new_to_old": round(new["peak_mb"] / old["peak_mb"], 3),
        "checked": checked,
    }
    record("decontamination", torch.device("cpu"), **fields)
    table(fields)
    if fields["new"]["planted_kept"]:
        sys.exit(f"{fields['new']['planted_kept']} planted rows were kept by the new filter")


def generate(splits: dict, args, path: Path) -> np.ndarray:
    """Write the transfer file (a ``text`` column; ``planted``: the kind of planted row, -1 for a generated one) and
    return the kinds."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(args.seed)
    sentences = [s for text in splits["train"] for s in re.split(r"(?<=[.!?])\s+", text.replace("\n", " ")) if s]
    sentences = np.array(sentences, dtype=object)
    evaluated = splits["validation"] + splits["test"]
    kinds = np.full(args.rows, -1, np.int8)
    where = rng.choice(args.rows, args.planted, replace=False)
    kinds[where] = np.arange(args.planted) % len(KINDS)
    # each kind plants its articles in a shuffled order, so no planted row repeats another (up to 637 of a kind)
    orders = {kind: iter(np.resize(rng.permutation(len(evaluated)), args.planted)) for kind in range(len(KINDS))}
    writer, chunk = None, 65_536
    for start in range(0, args.rows, chunk):
        texts = []
        for kind in kinds[start : start + chunk]:
            row = " ".join(sentences[rng.integers(0, len(sentences), rng.integers(3, 8))])
            if kind >= 0:
                row = plant(int(kind), evaluated[next(orders[int(kind)])], row, evaluated, rng)
            texts.append(row)
        table = pa.table({"text": texts, "planted": kinds[start : start + chunk]})
        writer = writer or pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
    writer.close()
    return kinds


def plant(kind: int, article: str, row: str, evaluated: list[str], rng) -> str:
    """A row that holds the evaluation text ``article``, in the way ``KINDS[kind]`` says."""
    words = article.split()
    return [
        lambda: "Reuters. " + article,
        lambda: f'The paper printed it in full: "{article}" Nobody replied.',
        lambda: article + " (Photo: AP. All rights reserved.)",
        lambda: row[: len(row) // 2] + " " + article + " " + row[len(row) // 2 :],
        lambda: "BREAKING: " + article.upper(),
        lambda: " ".join(words[: max(13, len(words) // 2)]) + " ... " + row,
        lambda: article + "\n\n" + evaluated[rng.integers(len(evaluated))],
    ][kind]()


def check(splits: dict, path: Path, planted: np.ndarray, new: dict, args) -> dict:
    """Every planted row dropped; a sample of the generated rows dropped by the words rule, and of those kept, read
    against a plain Python version of the rule."""
    import pandas as pd

    from kdpipe.data.contamination import NGRAM
    from kdpipe.data.folding import fold

    def words(text: str) -> list[str]:
        return [w for w in re.split(r"[^\w]+", text) if w]

    grams = set()
    for text in fold(pd.Series(splits["validation"] + splits["test"])):
        w = words(text)
        grams.update(tuple(w[i : i + NGRAM]) for i in range(len(w) - NGRAM + 1))
    reason, rng = new["reason"], np.random.default_rng(1)
    shared = NEW_REASONS.index("evaluation_shared") + 1
    generated = planted < 0
    dropped = np.flatnonzero(generated & (reason == shared))
    kept = np.flatnonzero(generated & (reason == 0))
    sample = {
        "dropped": np.sort(rng.choice(dropped, min(args.sample, len(dropped)), replace=False)),
        "kept": np.sort(rng.choice(kept, min(args.sample, len(kept)), replace=False)),
    }
    texts = pd.read_parquet(path, columns=["text"])["text"]
    # how often the material itself repeats an evaluation text: training sentences that share a 13-gram with one
    sentences = pd.Series([s for t in splits["train"] for s in re.split(r"(?<=[.!?])\s+", t.replace("\n", " ")) if s])
    long = [w for w in map(words, fold(sentences)) if len(w) >= NGRAM]
    repeated = sum(any(tuple(w[i : i + NGRAM]) in grams for i in range(len(w) - NGRAM + 1)) for w in long)
    agree = {"training_sentences_of_13_words_or_more": len(long), "of_them_sharing_a_13_gram": int(repeated)}
    for outcome, rows in sample.items():
        folded = fold(texts.iloc[rows].reset_index(drop=True))
        found = [any(tuple(w[i : i + NGRAM]) in grams for i in range(len(w) - NGRAM + 1)) for w in map(words, folded)]
        agree[outcome] = {"checked": len(rows), "share_a_13_gram": int(sum(found))}
    return agree


def summary(side: dict, planted: np.ndarray, reasons: tuple[str, ...]) -> dict:
    reason = side["reason"]
    by_kind = {
        kind: {name: int((reason[planted == i] == code).sum()) for code, name in enumerate(reasons, start=1)}
        for i, kind in enumerate(KINDS)
        if (planted == i).any()
    }
    by_kind = {kind: {name: n for name, n in counts.items() if n} for kind, counts in by_kind.items()}
    return {
        "seconds": round(side["seconds"], 1),
        "cpu_seconds": round(side["cpu_seconds"], 1),
        "peak_mb": round(side["peak_mb"], 1),
        "before_mb": round(side["before_mb"], 1),
        "planted_dropped": int((reason[planted >= 0] != 0).sum()),
        "planted_kept": int((reason[planted >= 0] == 0).sum()),
        "planted_dropped_by_kind": by_kind,
        "generated_dropped": {
            name: int((reason[planted < 0] == code).sum()) for code, name in enumerate(reasons, start=1)
        },
    }


def table(fields: dict) -> None:
    old, new = fields["old"], fields["new"]
    planted = fields["planted"]
    print(f"\n{fields['rows']:,} transfer rows ({planted:,} planted), {fields['evaluation_texts']} evaluation texts\n")
    print("| filter | wall s | CPU s | peak resident MB (before the pass) | planted dropped | generated dropped |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, side in (("whole texts and prefixes (old)", old), ("words rule (new)", new)):
        drops = ", ".join(f"{k} {v:,}" for k, v in side["generated_dropped"].items() if v) or "none"
        print(
            f"| {name} | {side['seconds']:,.1f} | {side['cpu_seconds']:,.1f} | {side['peak_mb']:,.0f} "
            f"({side['before_mb']:,.0f}) | "
            f"{side['planted_dropped']:,} of {planted:,} | {drops} |"
        )
    print(
        f"\nnew / old: wall time {fields['time_ratio_new_to_old']}x, CPU time {fields['cpu_time_ratio_new_to_old']}x, "
        f"peak memory {fields['peak_ratio_new_to_old']}x; load average at the end {fields['load_average']}"
    )
    print("planted rows dropped by kind, by reason (old / new):")
    for kind in new["planted_dropped_by_kind"]:
        print(f"  {kind}: {old['planted_dropped_by_kind'][kind]} / {new['planted_dropped_by_kind'][kind]}")
    print(f"plain Python check of the words rule's sample: {fields['checked']}")


# ---- a side, in a fresh process


def child(args) -> None:
    from kdpipe.core.memory import use_system_allocator
    from kdpipe.data.folding import copy_prefix
    from kdpipe.data.settings import TransferSettings
    from kdpipe.data.text_readers import text_readers
    from kdpipe.data.transfer import _reasons

    use_system_allocator()  # as a job started from the command line does (kdpipe.cli)
    params = {"name": "bbc", "transfer": args.file, "transfer_max_rows": None, "text_column": "text"}
    params |= {"text_pair_column": None, "format": "auto", "encoding": "utf-8", "split": {"seed": 13}}
    settings = TransferSettings.from_params({**params, "max_length": args.max_length}, "dataset")
    readers = text_readers(args.file, "dataset.transfer", settings)
    prefix = copy_prefix(args.max_length, False)
    rng = np.random.default_rng(7)
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident memory starts again from here
    started, cpu = time.perf_counter(), time.process_time()
    if args.child == "new":
        reason = _reasons(readers, Path(args.data), ["text"], prefix, None, rng)[0]
    else:
        reason = _old_reasons(readers, Path(args.data), ["text"], prefix, None, rng)[0]
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    np.save(args.reasons, reason)
    peak = _status("VmHWM") / 1024
    print(json.dumps({"seconds": seconds, "cpu_seconds": cpu, "peak_mb": peak, "before_mb": before / 1024}))


def _status(field: str) -> int:
    """A field of /proc/self/status, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


NEW_REASONS = (
    "empty",
    "duplicate",
    "evaluation",
    "evaluation_truncated",
    "evaluation_shared",
    "evaluation_contained",
    "labelled",
    "over_max_rows",
)
OLD_REASONS = ("empty", "duplicate", "evaluation", "evaluation_truncated", "labelled", "over_max_rows")


def _old_reasons(readers, data_dir: Path, columns: list[str], prefix: int | None, cap: int | None, rng):
    """kdpipe.data.transfer._reasons before the words rule (whole texts and the max_length prefix only)."""
    from kdpipe.core.store import KdpipeError
    from kdpipe.data.dataset import OOD, read_split
    from kdpipe.data.extra_split import empty_texts, held_out_rows
    from kdpipe.data.folding import fold_columns, folded_hashes, text_hashes

    code = {name: i for i, name in enumerate(OLD_REASONS, start=1)}
    evaluated = [read_split(data_dir, split) for split in ("validation", "test")]
    if (data_dir / f"{OOD}.parquet").is_file():
        evaluated += [read_split(data_dir, OOD), held_out_rows(data_dir)]
    evaluation = np.unique(np.concatenate([text_hashes(frame, columns) for frame in evaluated]))
    if prefix is not None:
        starts = np.unique(np.concatenate([folded_hashes(fold_columns(frame, columns), prefix) for frame in evaluated]))
    hashes, reasons, counts, multiline = [], [], {}, {}
    for where, reader in readers:
        read = lines = 0
        for batch in reader():
            hashes.append(text_hashes(batch, columns))
            reason = np.where(empty_texts(batch, columns), code["empty"], 0).astype(np.int8)
            if prefix is not None:
                reason[(reason == 0) & np.isin(folded_hashes(fold_columns(batch, columns), prefix), starts)] = code[
                    "evaluation_truncated"
                ]
            reasons.append(reason)
            lines += int(batch["text"].str.contains("\n", regex=False).sum())
            read += len(batch)
        if not read:
            raise KdpipeError(f"{where}: no data rows (dataset.transfer)")
        counts[where] = read
        if lines:
            multiline[where] = lines
    counts = {"rows": counts, "multiline_texts": multiline}
    hashed, reason = np.concatenate(hashes), np.concatenate(reasons)
    first = np.zeros(len(hashed), bool)
    first[np.unique(hashed, return_index=True)[1]] = True
    open_ = (reason == 0) | (reason == code["evaluation_truncated"])
    reason[open_ & ~first] = code["duplicate"]
    reason[open_ & first & np.isin(hashed, evaluation)] = code["evaluation"]
    labelled = text_hashes(read_split(data_dir, "train"), columns)
    reason[(reason == 0) & np.isin(hashed, labelled)] = code["labelled"]
    kept = np.flatnonzero(reason == 0)
    if cap is not None and len(kept) > cap:
        reason[np.sort(rng.choice(kept, len(kept) - cap, replace=False))] = code["over_max_rows"]
    return reason, hashed, counts


if __name__ == "__main__":
    main()
