"""Sharded MC-dropout: the wall time of one MC-dropout pass run by the workflow as S = 1, 2, 4 shard jobs.

Side by side in one run, in one temporary copy of the workflow: a MiniLM teacher is fine-tuned once on a slice of
BBC News, then for each S the signals are deleted and `snakemake --set-scatter mc_dropout=S` recomputes the teacher's
MC-dropout artifact (S shard jobs + the gather job; Snakemake's own start-up included, as a user sees it). S = 1
is the unsharded pass; the ratio to it is the result. The gathered `mc.npy` must be the same bytes for every S
(checked here too: a benchmark of a wrong answer is worth nothing).

    python benchmarks/sharded_signals.py                          # CPU: profiles/cpu, 1 thread a job, --cores 2
    python benchmarks/sharded_signals.py --profile profiles/workstation --gpus 4   # a workstation with 4 GPUs

Prints one Markdown row per S and appends JSON records to benchmarks/out/sharded_signals.jsonl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "out"
PARTS = ("Snakefile", "config.yaml", "workflow", "kdpipe", "profiles", "envs")


def config(rows_per_class: int, samples: int, max_length: int) -> dict:
    return {
        "dataset": {
            "name": "bbc",
            "source": "builtin:bbc_news",
            "max_per_class": rows_per_class,
            "split": {"validation": 0.1, "test": 0.2, "seed": 13},
        },
        "teacher_defaults": {"backbone": "builtin:minilm-l6", "max_length": max_length, "batch_size": 16, "lr": 1.0e-4},
        "teachers": {"t": {"epochs": 1}},
        "mc_dropout": {"samples": samples, "splits": ["train"]},
        "students": {},
    }


def snakemake(project: Path, args, *extra: str) -> float:
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "--profile",
        args.profile,
        "--configfile",
        "bench.yaml",
        "--cores",
        str(args.cores),
        *extra,
    ]
    if args.gpus:
        cmd += ["--resources", f"gpu={args.gpus}"]
    if args.shard_threads:
        cmd += ["--set-threads", f"signal_shard={args.shard_threads}"]
    env = {**os.environ, "PYTHONPATH": str(project), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    started = time.perf_counter()
    result = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"snakemake {' '.join(extra)} failed:\n{result.stderr[-3000:]}")
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rows-per-class", type=int, default=60, help="BBC rows per class (70%% of them are train)")
    p.add_argument("--samples", type=int, default=4, help="T, dropout samples")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--profile", default="profiles/cpu")
    p.add_argument("--cores", type=int, default=os.cpu_count())
    p.add_argument("--gpus", type=int, default=0, help="--resources gpu=N (workstation profile)")
    p.add_argument(
        "--shard-threads",
        type=int,
        default=None,
        help="torch threads of each shard job (--set-threads; default: the profile's)",
    )
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="kdpipe-bench-shards-") as tmp:
        project = Path(tmp)
        for part in PARTS:
            src = REPO / part
            (shutil.copytree if src.is_dir() else shutil.copy)(src, project / part)
        (project / "bench.yaml").write_text(yaml.safe_dump(config(args.rows_per_class, args.samples, args.max_length)))
        target = "results/signals/t/train/mc.npy"
        teacher_s = snakemake(project, args, "results/teachers/t")
        rows = len(pd.read_parquet(project / "results/data/bbc/train.parquet"))
        print(
            f"teacher fine-tuned in {teacher_s:.0f} s; {rows} train rows, T = {args.samples}, "
            f"max_length {args.max_length}, {args.profile}, --cores {args.cores}\n"
        )
        print("| S | wall s | speed-up vs S = 1 | mc.npy sha256 |\n| ---: | ---: | ---: | --- |")
        base, digests = None, set()
        for shards in args.shards:
            shutil.rmtree(project / "results/signals", ignore_errors=True)
            wall = snakemake(project, args, target, "--set-scatter", f"mc_dropout={shards}")
            digest = hashlib.sha256((project / target).read_bytes()).hexdigest()[:12]
            digests.add(digest)
            base = base or wall
            print(f"| {shards} | {wall:.1f} | {base / wall:.2f}x | {digest} |", flush=True)
            rec = {
                "date": date.today().isoformat(),
                "machine": platform.node(),
                "cores": args.cores,
                "profile": args.profile,
                "gpus": args.gpus,
                "rows": rows,
                "samples": args.samples,
                "max_length": args.max_length,
                "shards": shards,
                "shard_threads": args.shard_threads,
                "wall_s": round(wall, 2),
                "speedup": round(base / wall, 3),
                "sha256": digest,
            }
            OUT.mkdir(exist_ok=True)
            with open(OUT / "sharded_signals.jsonl", "a") as fh:
                fh.write(json.dumps(rec) + "\n")
        if len(digests) != 1:
            sys.exit(f"the gathered mc.npy differs between shard counts: {digests}")


if __name__ == "__main__":
    main()
