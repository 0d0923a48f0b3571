"""Snakemake's overhead per job on SLURM: a trivial rule from submission to completion, against the local executor.

Brings up the one-node SLURM cluster of the tests (tests/slurm/cluster.py: Debian's slurm-wlm and munge, needs
root), then runs tests/slurm/trivial.smk (rules that only `echo` into a file) side by side with the local executor
and with the slurm executor plugin:
- chain: N jobs each needing the previous one, so they run one after another and the wall time per job is one
  job's whole latency (submission, scheduling, start, the status check that sees it done);
- fan: N independent jobs at once, the throughput when the queue is full.
The overhead per job is (SLURM wall - local wall) / N for the chain.

    sudo python benchmarks/slurm_overhead.py --jobs 8

The plugin's status checks are the main cost. This cluster has no accounting database, so job states come from
`squeue` (`--slurm-status-command squeue`); the first check waits `--slurm-init-seconds-before-status-checks`
(2 s here, 40 s by default) and later ones every `--seconds-between-status-checks` (Snakemake's option).
Prints a Markdown table and appends JSON records to benchmarks/out/slurm_overhead.jsonl.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.slurm.cluster import Unavailable, start_cluster  # noqa: E402

OUT = Path(__file__).parent / "out"
SNAKEFILE = REPO / "tests/slurm/trivial.smk"


def run(workdir: Path, shape: str, jobs: int, slurm_args: list[str]) -> float:
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    cmd = [
        "timeout",
        "-k",
        "10",
        "900",
        str(Path(sys.executable).parent / "snakemake"),
        "--snakefile",
        str(SNAKEFILE),
        "--directory",
        str(workdir),
        "--config",
        f"count={jobs}",
        f"shape={shape}",
        "--jobs",
        str(jobs),
        "--cores",
        str(jobs),
        *slurm_args,
    ]
    started = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=8, help="N, jobs per shape")
    p.add_argument("--status-interval", type=int, default=2, help="--seconds-between-status-checks")
    args = p.parse_args()
    try:
        cluster = start_cluster(("cpu",), cpus=max(2, os.cpu_count() or 2), gpus=1)
    except Unavailable as err:
        sys.exit(f"no SLURM cluster: {err}")
    slurm = [
        "--executor",
        "slurm",
        "--default-resources",
        "slurm_partition=cpu",
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--seconds-between-status-checks",
        str(args.status_interval),
    ]
    print(
        "| shape | N | local s | SLURM s | SLURM s per job | overhead per job (s) |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: |"
    )
    try:
        with tempfile.TemporaryDirectory(prefix="kdpipe-bench-slurm-") as tmp:
            for shape in ("chain", "fan"):
                local = run(Path(tmp) / f"local-{shape}", shape, args.jobs, [])
                on_slurm = run(Path(tmp) / f"slurm-{shape}", shape, args.jobs, slurm)
                overhead = (on_slurm - local) / args.jobs
                print(
                    f"| {shape} | {args.jobs} | {local:.1f} | {on_slurm:.1f} | {on_slurm / args.jobs:.1f} | "
                    f"{overhead:.1f} |",
                    flush=True,
                )
                OUT.mkdir(exist_ok=True)
                with open(OUT / "slurm_overhead.jsonl", "a") as fh:
                    fh.write(
                        json.dumps(
                            {
                                "date": date.today().isoformat(),
                                "machine": platform.node(),
                                "shape": shape,
                                "jobs": args.jobs,
                                "local_s": round(local, 2),
                                "slurm_s": round(on_slurm, 2),
                                "overhead_per_job_s": round(overhead, 2),
                                "status_interval_s": args.status_interval,
                            }
                        )
                        + "\n"
                    )
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
