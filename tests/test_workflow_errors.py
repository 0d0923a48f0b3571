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


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    base = tmp_path_factory.mktemp("errors")
    return copy_project(base / "p"), environment(base / "p", base / "cache")


@pytest.mark.parametrize(
    "old, new, line",
    [
        # YAML reads 1e-3 (no dot) as text: the schema alone would only say "'1e-3' is not of type 'number'"
        (
            "  ta:\n    classes: {slice: 0, of: 2}\n",
            "  ta:\n    classes: {slice: 0, of: 2}\n    lr: 1e-3\n",
            "config: teachers.ta.lr is the string '1e-3': YAML reads 1e-3 without a dot as text; write 1.0e-3 or 0.001",
        ),
        # an empty list is not silently replaced by the default
        (
            "  s_vkd:\n    method: vanilla_kd\n",
            "  s_vkd:\n    method: vanilla_kd\n    seeds: []\n",
            "config: students.s_vkd.seeds: an empty list would train the student once, with seed 0; omit the key for "
            "that, or list the seeds, e.g. [0, 1, 2]",
        ),
        # a value the schema refuses: the key and the reason, not the schema entry
        (
            "  max_per_class: 12\n",
            "  max_per_class: 12\n  transfer_max_rows: 0\n",
            "config: dataset.transfer_max_rows: 0 is less than the minimum of 1",
        ),
        # feature dumps over their disk budget (kdpipe.plan.budget; numbers by hand in tests/test_budget.py)
        (
            "dump:\n  batch_size: 32\n",
            "dump:\n  batch_size: 32\n  max_gb: 1.0e-4\n",
            "config: dump.max_gb: the feature dumps of this config take up to 0.147 MB (2 dumps), but dump.max_gb "
            "allows 0.1 MB. The largest, hidden of teacher 'ta' on split 'train' (read by s_dfa), takes up to "
            "0.0737 MB (36 rows x 32 tokens (max_length) x 1 layer x 32 hidden units x 2 bytes): it would fit with "
            "max_length 11 instead of 32 (teachers.ta.max_length, and the same for the students that read it); or it "
            "needs no room with signals: online on s_dfa (the students run the teacher in their own jobs; no dump)",
        ),
    ],
)
def test_a_config_mistake_is_one_line_before_any_job(project, old, new, line):
    root, env = project
    text = (root / "tests/configs/tiny.yaml").read_text()
    assert text.count(old) == 1
    (root / "tests/configs/mistake.yaml").write_text(text.replace(old, new))
    snakemake = str(Path(sys.executable).parent / "snakemake")
    r = subprocess.run(
        [snakemake, "--dry-run", "--cores", "1", "--configfile", "tests/configs/mistake.yaml"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode != 0
    output = r.stdout + r.stderr
    assert line in output.splitlines()
    assert "Job stats" not in output and "rule " not in output
