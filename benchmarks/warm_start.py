"""The tiny test DAG from an empty results/ with warm start (jobs forked from one server that has imported torch and
transformers; docs/design.md, "Warm start") and with ``KDPIPE_WARM=0`` (every job a fresh Python), side by side.

Each run is in its own copy of the project (Snakefile, workflow/, kdpipe/, profiles/, tests/configs/), the two kinds
alternating over R pairs; the weights, signals and routes of the two kinds must be the same bytes (the other files
differ only in recorded times).

    python warm_start.py --pairs 2

Prints a Markdown table and appends JSON records to benchmarks/out/warm_start.jsonl.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

from workflow_overhead import SNAKEMAKE, timed

REPO = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "out"
COMPARED = (".safetensors", ".npy", ".parquet", "route.json")  # model weights, signals, routes, predictions


def project_copy(dest: Path) -> Path:
    dest.mkdir(parents=True)
    for name in ("Snakefile", "config.yaml", "workflow", "kdpipe", "profiles", "envs"):
        src = REPO / name
        copy = shutil.copytree if src.is_dir() else shutil.copy2
        copy(src, dest / name, **({"ignore": shutil.ignore_patterns("__pycache__")} if src.is_dir() else {}))
    shutil.copytree(REPO / "tests" / "configs", dest / "tests" / "configs")
    return dest


def run(project: Path, warm: bool) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "KDPIPE_WARM": "1" if warm else "0"}
    return timed([SNAKEMAKE, "--profile", "profiles/cpu", "--configfile", "tests/configs/tiny.yaml"], project, env)[0]


def digests(project: Path) -> dict[str, str]:
    results = project / "results"
    return {
        str(path.relative_to(results)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(results.rglob("*"))
        if path.is_file() and path.name.endswith(COMPARED) and "logs" not in path.parts and "report" not in path.parts
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=2)
    args = p.parse_args()
    walls: dict[bool, list[float]] = {True: [], False: []}
    made: dict[bool, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for warm in (i % 2 == 0, i % 2 != 0):  # alternate which kind goes first
                project = project_copy(Path(tmp) / f"{i}-{'warm' if warm else 'fresh'}")
                walls[warm].append(run(project, warm))
                made.setdefault(warm, digests(project))
                shutil.rmtree(project)
    same = made[True] == made[False]
    if not same:
        differ = sorted(k for k in made[True].keys() | made[False].keys() if made[True].get(k) != made[False].get(k))
        print(f"artifacts differ between warm and fresh runs: {differ[:10]}", file=sys.stderr)
    rec = {
        "date": date.today().isoformat(),
        "machine": platform.node(),
        "warm_s": walls[True],
        "fresh_s": walls[False],
        "artifacts": len(made[True]),
        "same_bytes": same,
    }
    OUT.mkdir(exist_ok=True)
    with open(OUT / "warm_start.jsonl", "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    warm_s, fresh_s = statistics.median(walls[True]), statistics.median(walls[False])
    print("| date | runs | warm start s | fresh processes s | ratio | artifacts the same bytes |")
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    print(
        f"| {rec['date']} | {args.pairs} + {args.pairs} | {warm_s:.1f} | {fresh_s:.1f} | {fresh_s / warm_s:.2f}x "
        f"| {'yes' if same else 'NO'} ({len(made[True])} files) |"
    )
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
