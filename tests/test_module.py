"""kdpipe used as a Snakemake module of another workflow (docs/cluster.md, "kdpipe as a module of your workflow"): a
smallest config runs end to end from an outer Snakefile with ``module`` and ``use rule * from``, its jobs running
the module's kdpipe, not one the outer folder holds."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_workflow import copy_project, environment

pytestmark = pytest.mark.slow

# one teacher, one student, the test split: the smallest run that goes through every kind of job
SMALLEST = """
dataset: {name: tiny_bbc, source: builtin:bbc_news, max_per_class: 6, split: {validation: 0.2, test: 0.2, seed: 1}}
teacher_defaults: {backbone: builtin:tiny-bert, epochs: 1, lr: 1.0e-3, batch_size: 8, max_length: 16}
teachers: {ta: {}}
mc_dropout: {splits: []}
student_defaults:
  model: {config: {tokenizer: builtin:tiny-bert, hidden_size: 16, num_layers: 1, num_heads: 1, intermediate_size: 32}}
  max_length: 16
  epochs: 1
students: {s: {method: vanilla_kd, lr: 1.0e-3}}
evaluate: {splits: [test]}
"""

OUTER = """
configfile: "smallest.yaml"


module kd:
    snakefile:
        "{snakefile}"
    config:
        config


use rule * from kd
"""


def test_kdpipe_runs_as_a_module_of_another_workflow(tmp_path):
    checkout = copy_project(tmp_path / "kdpipe")
    outer = tmp_path / "analysis"
    (outer / "kdpipe").mkdir(parents=True)  # another "kdpipe" where the outer workflow runs: never imported
    (outer / "kdpipe" / "__init__.py").write_text("raise ImportError('the outer folder's kdpipe was imported')\n")
    (outer / "Snakefile").write_text(OUTER.replace("{snakefile}", str(checkout / "Snakefile")))
    (outer / "smallest.yaml").write_text(SMALLEST)
    env = environment(checkout, tmp_path / "cache")
    env["PYTHONPATH"] = str(outer)  # the outer folder first, as a user's shell might have it

    command = [str(Path(sys.executable).parent / "snakemake"), "--profile", str(checkout / "profiles/cpu")]
    run = subprocess.run([*command, "--cores", "2"], cwd=outer, env=env, capture_output=True, text=True, timeout=900)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "outer folder's kdpipe" not in out
    evaluation = json.loads((outer / "results/eval/s/test.json").read_text())
    assert evaluation["kind"] == "student" and 0 <= evaluation["metrics"]["accuracy"] <= 1
    assert (outer / "results/report/summary.tsv").is_file()
    log = (outer / "results/logs/distill/s.log").read_text()
    assert "[kdpipe] distill s" in log  # the job's summary line: it ran to the end
    assert not (checkout / "results").exists()  # everything in the outer workflow's folder


def test_a_module_used_under_other_rule_names_runs_its_jobs(tmp_path):
    """``use rule * from kd exclude serve as kd_*``: every rule renamed and one left out; the renamed prepare job
    runs kdpipe's prepare stage (each rule keeps the command it was made with under its new name)."""
    checkout = copy_project(tmp_path / "kdpipe")
    outer = tmp_path / "analysis"
    outer.mkdir()
    renamed = OUTER.replace("use rule * from kd", "use rule * from kd exclude serve as kd_*")
    (outer / "Snakefile").write_text(renamed.replace("{snakefile}", str(checkout / "Snakefile")))
    (outer / "smallest.yaml").write_text(SMALLEST)
    env = environment(checkout, tmp_path / "cache")
    command = [str(Path(sys.executable).parent / "snakemake"), "--profile", str(checkout / "profiles/cpu")]
    run = subprocess.run(
        [*command, "--cores", "1", "results/data/tiny_bbc"], cwd=outer, env=env, capture_output=True, text=True
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "rule kd_prepare:" in out and "python -m kdpipe --threads 1 --log results/logs/prepare.log prepare" in out
    assert (outer / "results/data/tiny_bbc/manifest.json").is_file()
