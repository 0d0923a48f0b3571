"""Errors reach the user with any command line: plain `snakemake`, without --profile, prints a failed job's log
(profiles/default, the workflow profile Snakemake reads by itself)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_workflow import copy_project, edited_config, environment

pytestmark = pytest.mark.slow


def test_plain_snakemake_shows_the_failed_jobs_error(tmp_path):
    project = copy_project(tmp_path / "p")
    env = environment(project, tmp_path / "cache")

    def edit(config):
        config["teacher_defaults"]["backbone"] = "no-such-backbone-folder"
        config["students"] = {"s_vkd": {"method": "vanilla_kd"}}

    configfile = edited_config(project, edit)
    snakemake = str(Path(sys.executable).parent / "snakemake")
    r = subprocess.run(
        [snakemake, "--cores", "1", "--configfile", configfile],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode != 0
    output = r.stdout + r.stderr
    assert "Using workflow specific profile profiles/default" in output
    assert "kdpipe finetune-teacher: error: cannot load model 'no-such-backbone-folder'" in output
