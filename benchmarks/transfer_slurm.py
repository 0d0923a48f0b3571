"""A large unlabelled transfer pass as shard jobs on SLURM, side by side with the local executor on the same work.

One teacher (the tiny config's `builtin:tiny-bert`, max_length 32, on all classes of the tiny BBC subset) and
`dataset.transfer` pointing at a generated CSV of N distinct short synthetic texts (seeded random words from a fixed
vocabulary). Snakemake is asked for the teacher's logits on the transfer split only,
`results/signals/teacher/transfer/logits.parquet`, so each run is: prepare, fine-tune the teacher (1 epoch on a few
dozen rows), the `transfer` job (reads, checks and numbers the N rows), S `signal_shard` jobs (`dump.shards: S`)
and the `logits` gather job. It runs twice from scratch, each in its own copy of the project made from one snapshot
(`git archive` of --ref, HEAD by default; `--worktree` copies the working tree instead):

- local: `snakemake --profile profiles/cpu --cores 2` (1 thread per shard job, two at a time on 2 cores);
- SLURM: `snakemake --profile profiles/slurm` on the one-node SLURM 22.05 cluster of the tests (tests/slurm/cluster.py,
  needs root), with the test's options for that cluster only (tests/test_slurm.py): `--slurm-status-command squeue`,
  `--slurm-init-seconds-before-status-checks 2`, `--slurm-keep-successful-logs`. Its node has --gpus fake GPUs, so at
  most that many shard jobs (GPU rules in the profile) run at once.

When the SLURM jobs ran with other thread counts than the local ones (profiles/slurm asks 4 CPUs per GPU-rule job,
capped inside the job at the node's real cores; profiles/cpu gives them 1 thread), a third run repeats the local one
with SLURM's counts (`--set-threads`), to tell what a thread count changes in the bytes from what SLURM changes.

Each SLURM job Snakemake submitted is read back from `scontrol show job` (state, exit code, partition, CPUs, GRES,
start and end); every job must be COMPLETED. The shard phase is the first shard's start to the last shard's end (SLURM:
the jobs' StartTime/EndTime; local: Snakemake's timestamps). The peak resident memory (VmHWM) of each kdpipe stage
process is sampled from /proc, for both executors (the SLURM jobs run on this machine). The gathered
`logits.parquet` of the two runs are compared byte for byte; a difference is reported, not hidden.

    sudo .venv/bin/python benchmarks/transfer_slurm.py                 # 100,000 rows, 4 shards
    sudo .venv/bin/python benchmarks/transfer_slurm.py --rows 2000     # smoke test

Prints a Markdown table and appends one JSON record per executor to benchmarks/out/transfer_slurm.jsonl.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.slurm.cluster import Unavailable, start_cluster  # noqa: E402
from tests.test_workflow import PARTS, copy_project  # noqa: E402

OUT = Path(__file__).parent / "out"
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
CONFIG = "tests/configs/transfer_bench.yaml"
TEACHER = "teacher"
TARGET = f"results/signals/{TEACHER}/transfer/logits.parquet"
SLURM_OPTIONS = (
    "--slurm-status-command",
    "squeue",
    "--slurm-init-seconds-before-status-checks",
    "2",
    "--slurm-keep-successful-logs",
)
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")
FINISHED = re.compile(r"Finished jobid: (\d+) \(Rule: (\w+)\)")
STAMP = re.compile(r"^\[(\w{3} \w{3} +\d+ \d\d:\d\d:\d\d \d{4})\]$")
STAGES = ("prepare", "finetune-teacher", "transfer", "signal-shard", "signal-gather")
SYLLABLES = ("ba", "ko", "ri", "ta", "me", "lu", "sen", "dor", "vi", "pa", "gel", "tru", "am", "ex", "no", "qui")


# ---- the work: texts, config, project copies


def synthetic_texts(rows: int, seed: int = 7) -> list[str]:
    """``rows`` distinct texts of 5 to 12 words drawn (seeded) from a fixed vocabulary of 4,096 made-up words."""
    vocab = np.array([a + b + c for a in SYLLABLES for b in SYLLABLES for c in SYLLABLES])
    rng = np.random.default_rng(seed)
    texts: dict[str, None] = {}  # insertion-ordered set
    while len(texts) < rows:
        for length in rng.integers(5, 13, size=rows - len(texts)):
            texts.setdefault(" ".join(rng.choice(vocab, size=length)), None)
    return list(texts)


def bench_config(shards: int) -> dict:
    config = yaml.safe_load((REPO / "tests/configs/tiny.yaml").read_text())
    config["teachers"] = {TEACHER: {"epochs": 1}}  # one teacher on all classes (no `classes`)
    config["students"] = {name: config["students"][name] for name in ("s_none", "s_vkd")}
    config["evaluate"] = {"batch_size": 32}  # the tiny config's oracle names its two teachers
    config["dataset"]["transfer"] = "data/transfer.csv"
    config["dump"]["shards"] = shards
    return config


def snapshot(dest: Path, ref: str | None) -> str:
    """The project's parts at ``ref`` (git archive), or the working tree when ``ref`` is None; returns what it is."""
    if ref is None:
        copy_project(dest)
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", *PARTS], capture_output=True)
        head = git("rev-parse", "HEAD")
        return f"working tree at {head[:12]}" + (" (uncommitted changes)" if dirty.stdout.strip() else "")
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "--", *PARTS], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return git("rev-parse", ref)


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def make_project(dest: Path, source: Path, texts_csv: Path, config: dict) -> Path:
    shutil.copytree(source, dest)
    (dest / "data").mkdir()
    shutil.copy(texts_csv, dest / "data/transfer.csv")
    (dest / CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))
    return dest


def environment(project: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(project),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        KDPIPE_DEVICE="cpu",  # the cluster's GPUs are fake devices
        OMP_NUM_THREADS="1",
    )
    env.pop("SNAKEMAKE_OUTPUT_CACHE", None)
    return env


# ---- running one executor, with the kdpipe processes' peak memory sampled from /proc


def stage_of(pid: str, project: str) -> tuple[str, int] | None:
    """(stage, --threads) of a `python -m kdpipe [--threads N] <stage>` process working in ``project``."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
        if "kdpipe" not in args or args[max(0, args.index("kdpipe") - 1)] != "-m":
            return None
        if not os.readlink(f"/proc/{pid}/cwd").startswith(project):
            return None
    except OSError:
        return None
    rest = args[args.index("kdpipe") + 1 :]
    threads = 0
    while rest[:1] and rest[0].startswith("--"):  # kdpipe's global options (--threads N, --processes N)
        threads = int(rest[1]) if rest[0] == "--threads" else threads
        rest = rest[2:]
    return (rest[0], threads) if rest and rest[0] in STAGES else None


def peak_kb(pid: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_snakemake(cmd: list[str], project: Path, log: Path) -> tuple[float, str, dict]:
    """Wall seconds, output and {stage: {peak_mb, threads, processes}} of one Snakemake run in ``project`` (with
    "load": the machine's 1-minute load average at its start and end, under "stages")."""
    seen: dict[str, tuple[str, int]] = {}
    peaks: dict[str, int] = {}
    load = [os.getloadavg()[0]]
    with open(log, "w") as fh:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=project, env=environment(project), stdout=fh, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            for pid in filter(str.isdigit, os.listdir("/proc")):
                if pid not in seen and (found := stage_of(pid, str(project))):
                    seen[pid] = found
                if pid in seen:
                    peaks[pid] = max(peaks.get(pid, 0), peak_kb(pid))
            time.sleep(0.5)
        wall = time.perf_counter() - started
    load.append(os.getloadavg()[0])
    output = log.read_text(errors="replace")
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed (exit {proc.returncode}), log {log}:\n{output[-5000:]}")
    stages: dict[str, dict] = {}
    for pid, (stage, threads) in seen.items():
        entry = stages.setdefault(stage, {"peak_mb": 0.0, "threads": threads, "processes": 0})
        entry["peak_mb"] = max(entry["peak_mb"], round(peaks.get(pid, 0) / 1024, 1))
        entry["processes"] += 1
    stages["load"] = {"start": round(load[0], 2), "end": round(load[1], 2)}
    return wall, output, stages


def local_shard_phase(output: str) -> float:
    """Seconds from the first signal_shard job's start to the last one's end, by Snakemake's timestamps."""
    stamp, starts, ends = None, [], []
    for line in output.splitlines():
        if m := STAMP.match(line.strip()):
            stamp = dt.datetime.strptime(m.group(1), "%a %b %d %H:%M:%S %Y")
        elif re.match(r"(local)?rule signal_shard:", line):
            starts.append(stamp)
        elif (m := FINISHED.search(line)) and m.group(2) == "signal_shard":
            ends.append(stamp)
    return (max(ends) - min(starts)).total_seconds() if starts and ends else float("nan")


def slurm_jobs(cluster, output: str) -> list[dict]:
    """The SLURM jobs of this Snakemake run (the plugin names them by its run ID), as `scontrol show job` has them."""
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    keys = ("JobId", "Comment", "JobState", "ExitCode", "Partition", "NumCPUs", "JOB_GRES", "StartTime", "EndTime")
    return [{k: job.get(k) for k in keys} for job in cluster.jobs() if job["JobName"] == run_id]


def slurm_shard_phase(jobs: list[dict]) -> float:
    shards = [j for j in jobs if j["Comment"].startswith("rule_signal_shard")]
    if not shards:
        return float("nan")
    start = min(dt.datetime.fromisoformat(j["StartTime"]) for j in shards)
    return (max(dt.datetime.fromisoformat(j["EndTime"]) for j in shards) - start).total_seconds()


def check_slurm(output: str, jobs: list[dict]) -> list[str]:
    """Every job Snakemake ran was submitted once and COMPLETED on SLURM; the problems found, if any."""
    submitted = {int(s) for _, s in SUBMITTED.findall(output)}
    finished = [rule for _, rule in FINISHED.findall(output) if rule != "all"]
    problems = []
    if len(submitted) != len(finished):
        problems.append(f"{len(submitted)} jobs submitted to SLURM, {len(finished)} finished")
    if {int(j["JobId"]) for j in jobs} != submitted:
        problems.append(f"scontrol knows jobs {[j['JobId'] for j in jobs]}, Snakemake submitted {sorted(submitted)}")
    problems += [f"SLURM job {j}" for j in jobs if j["JobState"] != "COMPLETED" or j["ExitCode"] != "0:0"]
    return problems


# ---- the record


def machine() -> dict:
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    mem = next(
        line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal")
    )
    return {"machine": platform.node(), "cpu": cpu, "cores": os.cpu_count(), "mem_gib": round(int(mem) / 2**20, 1)}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def result(executor: str, project: Path, cmd: list[str], wall: float, shard_s: float, stages: dict, **extra) -> dict:
    manifest = json.loads(next((project / "results/transfer").glob("*/manifest.json")).read_text())
    rows = manifest["rows"]["transfer"]
    logits = project / TARGET
    return {
        "executor": executor,
        "command": " ".join(cmd),
        "transfer_rows": rows,
        "dropped": manifest.get("dropped"),
        "wall_s": round(wall, 1),
        "shard_phase_s": round(shard_s, 1),
        "s_per_1k_rows_wall": round(wall / rows * 1000, 2),
        "s_per_1k_rows_shards": round(shard_s / rows * 1000, 2),
        "stages": stages,
        "logits_bytes": logits.stat().st_size,
        "logits_sha256": sha256(logits),
        "teacher_sha256": sha256(project / f"results/teachers/{TEACHER}/model.safetensors"),
        **extra,
    }


def print_table(records: list[dict]) -> None:
    print(
        "\n| executor | rows | shard jobs | wall s | shard phase s | s per 1k rows (wall) | s per 1k rows (shards) | "
        "threads: teacher / shard job | peak MB: transfer job / shard job | logits sha256 | same bytes as SLURM |"
        "\n| --- | ---: | --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- |"
    )
    for r in records:
        stages = r["stages"]
        shard, transfer = stages.get("signal-shard", {}), stages.get("transfer", {})
        jobs = f"{r['shard_jobs']}" + (f" (SLURM: {r['shard_slurm_states']})" if r["executor"] == "slurm" else "")
        same = r.get("vs_slurm", {}).get("logits_bytes_identical", "–")
        print(
            f"| {r['executor']} | {r['transfer_rows']:,} | {jobs} | {r['wall_s']:.1f} | {r['shard_phase_s']:.1f} | "
            f"{r['s_per_1k_rows_wall']:.2f} | {r['s_per_1k_rows_shards']:.2f} | "
            f"{stages.get('finetune-teacher', {}).get('threads', '?')} / {shard.get('threads', '?')} | "
            f"{transfer.get('peak_mb', '?')} / {shard.get('peak_mb', '?')} | {r['logits_sha256'][:12]} | {same} |"
        )


# ---- main


def run_local(project: Path, log: Path, threads: dict | None = None) -> dict:
    """The local executor; with ``threads`` ({rule: n}) each rule's threads set to that (`--set-threads`)."""
    cmd = [SNAKEMAKE, "--profile", "profiles/cpu", "--configfile", CONFIG]
    if threads:
        cmd += ["--set-threads", *(f"{rule}={n}" for rule, n in threads.items())]  # nargs="+": not last
    cmd += ["--cores", "2"]
    wall, output, stages = run_snakemake([*cmd, TARGET], project, log)
    shard_jobs = sum(rule == "signal_shard" for _, rule in FINISHED.findall(output))
    executor = "local, SLURM's threads" if threads else "local"
    return result(executor, project, [*cmd, TARGET], wall, local_shard_phase(output), stages, shard_jobs=shard_jobs)


def slurm_threads(local: dict, on_slurm: dict) -> dict:
    """{rule: threads on SLURM} of every kdpipe stage with a thread count, when one of them differs from the local
    run's, else {}. All of them: `--set-threads` on the command line replaces the profile's whole set-threads."""
    threads = {stage: job["threads"] for stage, job in on_slurm["stages"].items() if job.get("threads")}
    local_threads = {stage: job["threads"] for stage, job in local["stages"].items() if job.get("threads")}
    return {stage.replace("-", "_"): n for stage, n in threads.items()} if threads != local_threads else {}


def run_slurm(project: Path, log: Path, cluster, timeout: int) -> dict:
    cmd = [SNAKEMAKE, "--profile", "profiles/slurm", "--configfile", CONFIG, *SLURM_OPTIONS, TARGET]
    wall, output, stages = run_snakemake(["timeout", "-k", "10", str(timeout), *cmd], project, log)
    jobs = slurm_jobs(cluster, output)
    problems = check_slurm(output, jobs)
    shards = [j for j in jobs if j["Comment"].startswith("rule_signal_shard")]
    states = [f"{j['JobState']} {j['ExitCode']}" for j in shards]
    return result(
        "slurm",
        project,
        cmd,
        wall,
        slurm_shard_phase(jobs),
        stages,
        shard_jobs=len(shards),
        shard_slurm_states=", ".join(f"{states.count(s)} {s}" for s in sorted(set(states))),
        slurm_jobs=jobs,
        slurm_problems=problems,
    )


def start(args):
    profile = yaml.safe_load((REPO / "profiles/slurm/profile.yaml").read_text())
    default = profile["default-resources"]["slurm_partition"]
    gpu_rules = [r for r in profile["set-resources"].values() if r["slurm_partition"] != default]
    partitions = (default, *sorted({r["slurm_partition"] for r in gpu_rules} - {default}))
    cpus = args.gpus * max(r.get("cpus_per_gpu", 1) for r in gpu_rules) + 2
    return start_cluster(partitions, cpus=cpus, gpus=args.gpus)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=100_000, help="synthetic transfer rows")
    p.add_argument("--shards", type=int, default=4, help="dump.shards: signal_shard jobs of the pass")
    p.add_argument("--gpus", type=int, default=2, help="fake GPUs of the SLURM node: shard jobs at once on SLURM")
    p.add_argument("--ref", default="HEAD", help="the commit whose project files are run (git archive)")
    p.add_argument("--worktree", action="store_true", help="run the working tree instead of --ref")
    p.add_argument("--local-only", action="store_true", help="no SLURM run (a smoke test without root)")
    p.add_argument("--timeout", type=int, default=7200, help="seconds for the SLURM run (timeout -k 10)")
    p.add_argument("--no-matched-threads", action="store_true", help="no local run with the SLURM jobs' thread counts")
    p.add_argument("--keep", action="store_true", help="keep the temporary projects (kept anyway on a failure)")
    return p.parse_args()


def logits_array(project: Path) -> np.ndarray:
    return np.stack(pd.read_parquet(project / TARGET)["logits"].to_numpy())


def compare_with_slurm(records: list[dict], projects: list[Path]) -> None:
    """Each local record gets how its logits and teacher compare with the SLURM run's (the last record)."""
    on_slurm = logits_array(projects[-1])
    for record, project in zip(records[:-1], projects[:-1]):
        logits = logits_array(project)
        record["vs_slurm"] = {
            "logits_bytes_identical": record["logits_sha256"] == records[-1]["logits_sha256"],
            "teacher_bytes_identical": record["teacher_sha256"] == records[-1]["teacher_sha256"],
            "logits_max_abs_diff": float(np.abs(logits - on_slurm).max()),
            "rows_with_another_argmax": int((logits.argmax(1) != on_slurm.argmax(1)).sum()),
        }


def run_all(args, tmp: Path, cluster) -> tuple[list[dict], list[Path]]:
    """The local run, then (with a cluster) the SLURM run and, when SLURM's jobs got other thread counts, the local
    run again with those (`--set-threads`): what tells a thread count's bytes from SLURM's."""
    pd.DataFrame({"text": synthetic_texts(args.rows)}).to_csv(tmp / "transfer.csv", index=False)
    config = bench_config(args.shards)
    projects = [make_project(tmp / "local", tmp / "snapshot", tmp / "transfer.csv", config)]
    records = [run_local(projects[0], tmp / "local.log")]
    print(f"local: {records[0]['wall_s']} s", flush=True)
    if cluster is None:
        return records, projects
    on_slurm = make_project(tmp / "slurm", tmp / "snapshot", tmp / "transfer.csv", config)
    slurm_record = run_slurm(on_slurm, tmp / "slurm.log", cluster, args.timeout)
    slurm_record["slurm_version"] = cluster.run("sinfo", "--version").stdout.strip()
    print(f"slurm: {slurm_record['wall_s']} s", flush=True)
    threads = slurm_threads(records[0], slurm_record)
    if threads and not args.no_matched_threads:
        projects.append(make_project(tmp / "local_threads", tmp / "snapshot", tmp / "transfer.csv", config))
        records.append(run_local(projects[-1], tmp / "local_threads.log", threads))
        print(f"local with SLURM's threads {threads}: {records[-1]['wall_s']} s", flush=True)
    records.append(slurm_record)
    projects.append(on_slurm)
    compare_with_slurm(records, projects)
    return records, projects


def report(records: list[dict], args, code: str) -> None:
    common = {"date": dt.date.today().isoformat(), **machine(), "code": code, "rows": args.rows}
    common |= {"shards": args.shards, "gpus": args.gpus}
    OUT.mkdir(exist_ok=True)
    with open(OUT / "transfer_slurm.jsonl", "a") as fh:
        for r in records:
            fh.write(json.dumps({**common, **r}) + "\n")
    print_table(records)
    for r in records:
        for j in r.get("slurm_jobs", []):
            print(
                f"SLURM job {j['JobId']}: {j['Comment']} {j['JobState']} {j['ExitCode']} partition={j['Partition']} "
                f"cpus={j['NumCPUs']} gres={j['JOB_GRES']} {j['StartTime']} -> {j['EndTime']}"
            )
        if "vs_slurm" in r:
            print(f"{r['executor']} vs slurm: {r['vs_slurm']}")
        for problem in r.get("slurm_problems", []):
            print(f"SLURM problem: {problem}")


def main() -> None:
    args = parse_args()
    cluster = None
    if not args.local_only:
        try:
            cluster = start(args)
        except Unavailable as err:
            sys.exit(f"no SLURM cluster: {err}\n(--local-only runs the local executor alone)")
    tmp = Path(tempfile.mkdtemp(prefix="kdpipe-bench-transfer-"))
    print(f"work folder: {tmp}", flush=True)
    try:
        code = snapshot(tmp / "snapshot", None if args.worktree else args.ref)
        records, _ = run_all(args, tmp, cluster)
        report(records, args, code)
    except BaseException:
        args.keep = True
        raise
    finally:
        if cluster is not None:
            cluster.stop()
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
