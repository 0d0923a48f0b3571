"""envs/kdpipe.yaml (for `--software-deployment-method conda`) keeps the same pins as the pip install."""

from __future__ import annotations

import re

import tomllib
import yaml

from tests.conftest import REPO

# What only the Snakemake process needs, not the jobs that run inside the environment
DRIVER_ONLY = {"snakemake", "snakemake-executor-plugin-slurm"}


def test_conda_environment_has_the_pins_of_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((REPO / "envs/kdpipe.yaml").read_text())
    [pip] = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    wanted = {d for d in project if d.split("=")[0].split(">")[0].split("<")[0] not in DRIVER_ONLY}
    assert set(pip) == wanted
    assert any(str(d).startswith("python=3.11") for d in env["dependencies"])


def test_every_rule_that_runs_kdpipe_names_the_environment():
    for rules in (REPO / "workflow/rules").glob("*.smk"):
        text = rules.read_text()
        assert text.count('"python -m kdpipe ') == len(re.findall(r"\n +conda:\n +ENV\n", text)), rules.name


def gpu_rules() -> set[str]:
    """The rules that declare a ``gpu`` resource (directly or through the shard rules' SHARD_RESOURCES)."""
    found = set()
    for rules in (REPO / "workflow/rules").glob("*.smk"):
        for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", rules.read_text(), re.M | re.S):
            if "        gpu=" in body or "**SHARD_RESOURCES" in body:
                found.add(name)
    return found


def test_every_gpu_rule_is_placed_by_the_profiles():
    """A GPU rule missing from the SLURM profile would ask for a GPU in the CPU partition (and one given a `gpu` there
    would lose its own count, a training job's `devices`); one missing from the CPU profile would take every core of
    a 2-core machine."""
    rules = gpu_rules()
    assert {"finetune_teacher", "distill", "signal_shard", "prototypes"} <= rules
    slurm = yaml.safe_load((REPO / "profiles/slurm/profile.yaml").read_text())
    cpu = yaml.safe_load((REPO / "profiles/cpu/profile.yaml").read_text())
    for rule in rules:
        placed = slurm["set-resources"][rule]
        assert placed["slurm_partition"] != slurm["default-resources"]["slurm_partition"], rule
        assert "gpu" not in placed, f"{rule}: the profile would override the rule's GPU count (devices)"
        assert rule in slurm["set-threads"] and rule in cpu["set-threads"], rule
