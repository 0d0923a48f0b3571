"""How long the workflow takes to decide what to run: the no-op rerun of an up-to-date workflow, and the DAG of a
sweep of P students.

Side by side in one run, each against Snakemake alone on a trivial workflow of the same shape, so the ratio is
kdpipe's own cost (its plan, config checks and code fingerprints):
- no-op: `snakemake --profile profiles/cpu` in a workflow directory whose results are up to date (run `make run`
  first; `--workdir` names it, the repository by default), R times; beside it a one-rule Snakefile whose output
  exists;
- sweep: `snakemake -n` (the DAG build and job selection, nothing run) on config.yaml with its students replaced by
  one vanilla-KD student repeated over P seeds and the MC-dropout pass in S = 4 shards
  (docs/cluster.md, "A sweep of hundreds of students"), in an empty directory; beside it a Snakefile of as many
  independent trivial jobs.

    python workflow_overhead.py --workdir /path/to/a/finished/clone --students 300

Prints a Markdown table and appends JSON records to benchmarks/out/workflow_overhead.jsonl.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "out"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
TRIVIAL = """
N = int(config["jobs"])
rule all:
    input: expand("out/{i}.txt", i=range(N))
rule one:
    output: "out/{i}.txt"
    shell: "touch {output}"
"""


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, str]:
    """The wall time and output of ``cmd`` in ``cwd``; a failure stops the benchmark with its error."""
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed in {cwd}:\n{done.stderr[-3000:]}")
    return wall, done.stdout + done.stderr


def jobs_in(output: str) -> int:
    """The total of a dry run's job table (0 when nothing is to be done)."""
    match = re.search(r"^total\s+(\d+)", output, re.M)
    return int(match.group(1)) if match else 0


def noop(workdir: Path, repeats: int) -> dict:
    cmd = [SNAKEMAKE, "--profile", "profiles/cpu", "--cores", "2"]  # the workflow directory's own Snakefile
    walls = []
    for _ in range(repeats):
        wall, output = timed(cmd, workdir)
        if "Nothing to be done" not in output:
            sys.exit(f"{workdir} is not up to date (run `make run` there first):\n{output[-2000:]}")
        walls.append(wall)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Snakefile").write_text(TRIVIAL)
        base_cmd = [SNAKEMAKE, "--cores", "2", "--config", "jobs=1"]
        timed(base_cmd, Path(tmp))
        base = [timed(base_cmd, Path(tmp))[0] for _ in range(repeats)]
    return {"kdpipe_s": statistics.median(walls), "snakemake_s": statistics.median(base)}


def sweep(students: int, shards: int) -> dict:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["students"] = {"sweep": {"method": "vanilla_kd", "seeds": list(range(students))}}
    config["evaluate"]["oracle"] = []
    config["mc_dropout"]["shards"] = shards
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "sweep.yaml").write_text(yaml.safe_dump(config))
        cmd = [SNAKEMAKE, "-n", "--cores", "2", "--snakefile", str(REPO / "Snakefile"), "--configfile", "sweep.yaml"]
        wall, output = timed(cmd, work)
        jobs = jobs_in(output)
        (work / "Snakefile").write_text(TRIVIAL)
        base, _ = timed([SNAKEMAKE, "-n", "--cores", "2", "--config", f"jobs={jobs}"], work)
    return {"jobs": jobs, "kdpipe_s": wall, "snakemake_s": base}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=REPO, help="a workflow directory after `make run`")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--students", type=int, default=300)
    p.add_argument("--shards", type=int, default=4)
    args = p.parse_args()
    rows = {
        "no-op rerun": noop(args.workdir.resolve(), args.repeats),
        "sweep dry run": sweep(args.students, args.shards),
    }
    OUT.mkdir(exist_ok=True)
    print("| date | what | jobs | kdpipe s | Snakemake alone s | ratio |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for what, row in rows.items():
        rec = {"date": date.today().isoformat(), "machine": platform.node(), "what": what, **row}
        with open(OUT / "workflow_overhead.jsonl", "a") as fh:
            fh.write(json.dumps(rec) + "\n")
        print(
            f"| {rec['date']} | {what} | {row.get('jobs', 0)} | {row['kdpipe_s']:.2f} | {row['snakemake_s']:.2f} "
            f"| {row['kdpipe_s'] / row['snakemake_s']:.2f}x |"
        )


if __name__ == "__main__":
    main()
