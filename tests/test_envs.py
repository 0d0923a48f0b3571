"""envs/kdpipe.yaml (for `--software-deployment-method conda`) keeps the same pins as the pip install."""

from __future__ import annotations

import re

import tomllib
import yaml

from kdpipe.stages.catalog import STAGES
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
    """Every rule that runs kdpipe is made by the one skeleton (tests/test_stages.py), which names the environment."""
    skeleton = (REPO / "workflow/rules/stages.smk").read_text()
    assert re.search(r"\n +conda:\n +ENV\n", skeleton)
    assert 'ENV = "../../envs/kdpipe.yaml"' in (REPO / "workflow/rules/common.smk").read_text()


def gpu_rules() -> set[str]:
    """The rules that declare a ``gpu`` resource: every stage that runs a model (kdpipe/stages/catalog.py) but the
    users' ``predict``; a whole signal pass (its rule named after its signals) takes signal_shard's placement."""
    return {s.rule for s in STAGES.values() if s.model} - {"predict", "signal_pass"}


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
