"""End to end on the full-label tiny config: Dynamic KD (a small and a large teacher, hidden states), Hydra and
Hydra+ (an ensemble of two seeds, multi-head students), the ensemble's own evaluation, and what an edit reruns."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.test_workflow import edited_config, finished_project, planned_jobs, signal_jobs, student_jobs

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/tiny_full.yaml"
STUDENTS = ("s_vkd", "s_dyn_teacher", "s_dyn_data", "s_dyn_objective", "s_hydra", "s_hydra_plus")


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    project, env, _ = finished_project(tmp_path_factory, "workflow_full", configfile=CONFIG)
    return project, env


def test_full_label_methods_run_end_to_end(done):
    project, _ = done
    r = project / "results"
    summary = pd.read_csv(r / "report/summary.tsv", sep="\t")
    assert set(summary["model"]) == {"ens.seed0", "ens.seed1", "small", "ens", *STUDENTS}
    assert set(summary.loc[summary["kind"] == "student", "method"]) == {
        "vanilla_kd",
        "dynamic_teacher",
        "dynamic_data",
        "dynamic_objective",
        "hydra",
        "hydra_plus",
    }
    ensemble = json.loads((r / "eval/ens/test.json").read_text())
    members = [json.loads((r / f"eval/ens.seed{i}/test.json").read_text()) for i in (0, 1)]
    assert ensemble["kind"] == "ensemble" and ensemble["members"] == 2
    assert ensemble["params"] == sum(m["params"] for m in members)
    hydra = json.loads((r / "eval/s_hydra_plus/test.json").read_text())
    assert hydra["members"] == 2 and hydra["metrics"]["uncertainty"]["epistemic"] >= 0
    assert (r / "students/s_hydra_plus/multihead.json").exists()
    assert (r / "report/uncertainty.png").stat().st_size > 0
    # dynamic_objective read the hidden states of teacher states 0 and 2 (the tiny teacher has 2 layers)
    assert json.loads((r / "signals/ens.seed0/train/hidden.json").read_text())["layers"] == [0, 2]


def test_small_teacher_change_reruns_only_what_reads_it(done):
    project, env = done
    config = edited_config(project, lambda c: c["teachers"]["small"].update(epochs=2), base=CONFIG)
    assert planned_jobs(project, env, config) == {
        ("finetune_teacher", "teacher=small"),
        *signal_jobs("small", "logits"),
        ("evaluate", "model=small"),
        *student_jobs("s_dyn_teacher"),
        ("report", ""),
    }


def test_ensemble_member_change_reruns_the_ensemble_and_its_students(done):
    project, env = done
    config = edited_config(project, lambda c: c["teachers"]["ens"].update(ensemble={"seeds": [0, 2]}), base=CONFIG)
    jobs = planned_jobs(project, env, config)
    # ens.seed1 left the ensemble, ens.seed2 joined: only the new member trains; the ensemble's students rerun.
    assert ("finetune_teacher", "teacher=ens.seed2") in jobs
    assert not any(rule == "finetune_teacher" and "seed0" in wc for rule, wc in jobs)
    assert {("evaluate_ensemble", "ensemble=ens"), *student_jobs("s_hydra", "s_hydra_plus")} <= jobs
    assert not any("s_dyn" in wc or "s_vkd" in wc for _, wc in jobs)


def test_hydra_student_change_reruns_only_that_student(done):
    project, env = done
    config = edited_config(
        project, lambda c: c["students"]["s_hydra_plus"]["method_args"].update(beta=0.7), base=CONFIG
    )
    assert planned_jobs(project, env, config) == {*student_jobs("s_hydra_plus"), ("report", "")}
