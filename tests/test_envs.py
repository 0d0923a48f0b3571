"""envs/kdpipe.yaml (for `--software-deployment-method conda`) keeps the same pins as the pip install."""

from __future__ import annotations

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
        assert text.count("{KDPIPE}") == text.count("    conda:\n        ENV\n"), rules.name
