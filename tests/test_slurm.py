"""The workflow on a real SLURM, through `--profile profiles/slurm` as a user runs it.

A one-node SLURM 22.05 cluster comes up on localhost from Debian's slurm-wlm and munge (tests/slurm/cluster.py:
installed with apt-get when missing and we are root; the tests skip, saying why, when it cannot be installed or
started). Its partitions are the ones the profile names, and its node has a GPU GRES (fake devices) with the CPUs
the profile's GPU jobs ask for, so every sbatch option the profile produces is really scheduled by SLURM.

Two command-line options are added to the profile, both about this test cluster, not about the workflow:
`--slurm-status-command squeue` (the cluster has no slurmdbd, so `sacct` cannot answer; MinJobAge is 3600 s) and
`--slurm-init-seconds-before-status-checks 2` (the plugin's 40 s default would dominate these short jobs).
`--slurm-keep-successful-logs` keeps every job's SLURM log for the checks. Each Snakemake runs under
`timeout -k 10`: the plugin can wait forever, ignoring SIGTERM, when it loses track of its jobs.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.conftest import REPO
from tests.slurm.cluster import Unavailable, start_cluster
from tests.test_training import read_resume_state
from tests.test_workflow import copy_project, edited_config, environment

pytestmark = pytest.mark.slow

SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")
PROFILE = yaml.safe_load((REPO / "profiles/slurm/profile.yaml").read_text())
DEFAULT_PARTITION = PROFILE["default-resources"]["slurm_partition"]
# the rules the profile sends to the GPU partition (their GPU count is the rule's own gpu resource)
GPU_RULES = {
    r: res
    for r, res in PROFILE["set-resources"].items()
    if res.get("slurm_partition", DEFAULT_PARTITION) != DEFAULT_PARTITION
}
GPUS = 2  # fake GPUs on the node: two GPU jobs at a time
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (\S+)\)\.")
FINISHED = re.compile(r"Finished jobid: (\d+) \(Rule: ([\w+]+)\)")  # (a pass's rule: logits+pooled+hidden)


def rule_resources(rule: str) -> dict | None:
    """The profile's set-resources of a rule; a whole signal pass (S = 1, a rule named after its signals) takes
    signal_shard's (workflow/rules/common.smk)."""
    from kdpipe.signals.catalog import SIGNALS

    whole_pass = all(name in SIGNALS for name in rule.split("+"))
    return GPU_RULES.get(rule) or (GPU_RULES["signal_shard"] if whole_pass else None)


@pytest.fixture(scope="module")
def cluster():
    partitions = (DEFAULT_PARTITION, *sorted({r["slurm_partition"] for r in GPU_RULES.values()} - {DEFAULT_PARTITION}))
    cpus_per_gpu = max(r.get("cpus_per_gpu", 1) for r in GPU_RULES.values())
    try:
        cluster = start_cluster(partitions, cpus=GPUS * cpus_per_gpu + 2, gpus=GPUS)
    except Unavailable as err:
        pytest.skip(f"no SLURM cluster for the test: {err}")
    yield cluster
    cluster.stop()


def slurm_snakemake(project: Path, env: dict, *args: str, configfile: str, timeout=1200, background=False):
    cmd = [
        "timeout",
        "-k",
        "10",
        str(timeout),
        SNAKEMAKE,
        "--profile",
        "profiles/slurm",
        "--configfile",
        configfile,
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--slurm-keep-successful-logs",
        *args,
    ]
    if background:
        log = open(project / "snakemake.out", "w")  # noqa: SIM115 (Snakemake in the background writes it)
        return subprocess.Popen(cmd, cwd=project, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    result = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=timeout + 30)
    return result.returncode, result.stdout + result.stderr


def run_jobs(cluster, output: str) -> list[dict]:
    """The SLURM jobs of the Snakemake run whose output this is (the plugin names them all by its run ID)."""
    run_id = re.search(r"SLURM run ID: (\S+)", output).group(1)
    return [job for job in cluster.jobs() if job["JobName"] == run_id]


def when(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp)


def most_at_once(jobs: list[dict]) -> int:
    """The largest number of these jobs that ran at the same time."""
    events = sorted([(when(j["StartTime"]), 1) for j in jobs] + [(when(j["EndTime"]), -1) for j in jobs])
    running = peak = 0
    for _, step in events:  # at equal times, ends (-1) sort before starts
        running += step
        peak = max(peak, running)
    return peak


# The tiny config's students that the tests here need: one that reads logits, the routed MUKI student, and the one
# the failing-job test breaks (each further student only adds a distill and an evaluate job on the cluster)
STUDENTS = ("s_vkd", "s_muki", "s_muki_no_mc")


def slurm_config(project: Path, edit=lambda config: None) -> str:
    """The tiny config with only STUDENTS, and ``edit`` applied, written into ``project``."""

    def trim_and_edit(config: dict) -> None:
        config["students"] = {name: config["students"][name] for name in STUDENTS}
        edit(config)

    return edited_config(project, trim_and_edit)


@pytest.fixture(scope="module")
def tiny_run(cluster, tmp_path_factory):
    """The tiny config (its students cut to STUDENTS) run once to completion on the cluster; the later tests edit
    it."""
    base = tmp_path_factory.mktemp("slurm")
    project = copy_project(base / "project")
    (base / "cache").mkdir()
    env = {**environment(project, base / "cache"), "KDPIPE_DEVICE": "cpu"}
    started = time.perf_counter()
    rc, output = slurm_snakemake(project, env, configfile=slurm_config(project))
    wall = time.perf_counter() - started
    assert rc == 0, f"snakemake on SLURM failed:\n{output[-6000:]}\n{cluster.log('slurmctld')}"
    print(f"\ntiny config on SLURM: {wall:.0f} s")
    return project, env, output


def test_tiny_config_runs_every_job_as_a_slurm_job(cluster, tiny_run):
    project, _, output = tiny_run
    submitted = {int(j): (int(s), Path(log)) for j, s, log in SUBMITTED.findall(output)}
    finished = {int(j): rule for j, rule in FINISHED.findall(output) if rule != "all"}
    assert finished and set(submitted) == set(finished), "every job Snakemake ran was submitted to SLURM, once"
    jobs = {int(job["JobId"]): job for job in run_jobs(cluster, output)}
    assert sorted(jobs) == sorted(s for s, _ in submitted.values()), "SLURM ran exactly the jobs Snakemake submitted"

    for smk_id, (slurm_id, log) in submitted.items():
        rule, job = finished[smk_id], jobs[slurm_id]
        assert job["JobState"] == "COMPLETED" and job["ExitCode"] == "0:0", job
        assert job["Comment"] == f"rule_{rule}" or job["Comment"].startswith(f"rule_{rule}_wildcards_"), job
        assert log.name == f"{slurm_id}.log" and f"rule {rule}:" in log.read_text(), log
        if rule_resources(rule):
            # the rule's gpu=1 and the profile's cpus_per_gpu became a real allocation in the GPU partition
            assert job["Partition"] == rule_resources(rule)["slurm_partition"], job
            assert job.get("JOB_GRES") == "gpu:1" and job["TresPerJob"] == "gres:gpu:1", job
            assert job["NumCPUs"] == str(rule_resources(rule)["cpus_per_gpu"]), job
        else:
            assert job["Partition"] == DEFAULT_PARTITION, job
            assert job.get("JOB_GRES", "(null)") == "(null)", f"{rule} got a GPU; is it missing in the profile? {job}"
    gpu_jobs = [job for job in jobs.values() if job.get("JOB_GRES") == "gpu:1"]
    assert {finished[j] for j in submitted} >= {"prepare", "finetune_teacher", "distill", "evaluate", "report"}
    assert 1 < most_at_once(gpu_jobs) <= cluster.gpus, "SLURM ran GPU jobs side by side, never more than the GPUs"

    summary = pd.read_csv(project / "results/report/summary.tsv", sep="\t")
    assert {"ta", "tb", "s_vkd", "s_muki"} <= set(summary["model"])


def test_failing_job_is_reported_as_a_failed_slurm_job(cluster, tiny_run):
    project, env, _ = tiny_run
    # a student whose backbone folder does not exist: the plan cannot tell it from a hub name, the job finds out
    missing = {"init": {"from": "no-such-backbone-folder", "layers": [0]}}
    config = slurm_config(project, lambda c: c["students"]["s_muki_no_mc"].update(model=missing))
    rc, output = slurm_snakemake(project, env, configfile=config, timeout=600)
    assert rc != 0
    jobs = run_jobs(cluster, output)
    # the profile's retries: 1 resubmits once, with the runtime of attempt 2 ("attempt * 120" minutes)
    assert [(j["Comment"], j["JobState"], j["TimeLimit"]) for j in jobs] == [
        ("rule_distill_wildcards_s_muki_no_mc", "FAILED", "02:00:00"),
        ("rule_distill_wildcards_s_muki_no_mc", "FAILED", "04:00:00"),
    ], jobs
    for job in jobs:
        assert f"SLURM-job '{job['JobId']}' failed, SLURM status is: 'FAILED'" in output
    assert "Error in rule distill" in output
    assert "cannot load model 'no-such-backbone-folder'" in output  # the stage's own message (its log)
    assert not (project / "results/students/s_muki_no_mc").exists()


def test_rerun_after_a_cancelled_job_resumes_and_completes(cluster, tiny_run):
    project, env, _ = tiny_run
    config = slurm_config(project, lambda c: c["teachers"]["ta"].update(epochs=60))
    target = "results/teachers/ta"
    resume = project / "results/teachers/.resume/ta"
    # --retries 0 so that the cancel ends this run as a failure instead of being retried within it
    proc = slurm_snakemake(project, env, target, "--retries", "0", configfile=config, timeout=600, background=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and (read_resume_state(resume) or {}).get("epoch", 0) < 2:
            assert proc.poll() is None, (project / "snakemake.out").read_text()[-4000:]
            time.sleep(0.2)
        running = [
            j
            for j in cluster.jobs()
            if j["Comment"] == "rule_finetune_teacher_wildcards_ta" and j["JobState"] == "RUNNING"
        ]
        assert len(running) == 1, running
        killed = running[0]["JobId"]
        cluster.run("scancel", killed)
        assert proc.wait(timeout=300) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (project / "snakemake.out").read_text()
    assert f"SLURM-job '{killed}' failed, SLURM status is: 'CANCELLED'" in output
    killed_at = read_resume_state(resume)
    assert killed_at and killed_at["epoch"] >= 2
    assert not (project / target).exists(), "a cancelled job left a finished-looking output"

    rc, output = slurm_snakemake(project, env, target, configfile=config, timeout=600)
    assert rc == 0, output[-4000:]
    [job] = run_jobs(cluster, output)
    assert job["Comment"] == "rule_finetune_teacher_wildcards_ta" and job["JobState"] == "COMPLETED"
    log = (project / "results/logs/finetune_teacher/ta.log").read_text()
    assert f"resuming teacher at epoch {killed_at['epoch']}" in log
    assert (project / target / "model.safetensors").exists() and not resume.exists()
