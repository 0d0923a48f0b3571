"""End to end, out-of-distribution evaluation (docs/methods.md, "Judging uncertainty"): one class held out of the
tiny run, an ensemble, a two-head Hydra student and a vanilla KD student, MC-dropout at evaluation. No model trains
on the held-out class; every model gets ood.json; the report has the OOD table; changing evaluate.mc_samples reruns
only evaluations (read from the dry run's job list)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.test_workflow import finished_project, planned_jobs, snakemake

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/tiny_ood.yaml"
MODELS = ("ens.seed0", "ens.seed1", "ens", "s_hydra", "s_vkd")


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    return finished_project(tmp_path_factory, "ood", configfile=CONFIG)


def test_no_model_trains_on_the_held_out_class_and_every_model_is_scored_against_it(held_out):
    project, _, _ = held_out
    data = project / "results/data/tiny_ood"
    assert "tech" not in json.loads((data / "labels.json").read_text())
    assert set(pd.read_parquet(data / "ood.parquet")["label"]) == {"tech"}
    for model in MODELS:
        record = json.loads((project / f"results/eval/{model}/ood.json").read_text())
        assert "tech" not in record["classes"]
        ood = record["ood"]
        assert ood["classes"] == ["tech"] and ood["n_ood"] == len(pd.read_parquet(data / "ood.parquet"))
        assert 0 <= ood["scores"]["entropy"]["auroc"] <= 1
        several = model in ("ens", "s_hydra")  # an ensemble's members, a student's heads
        assert ("mutual_info" in ood["scores"]) == several, model
        assert ("mc_mutual_info" in ood["scores"]) == (model != "ens"), model  # the ensemble runs no model
        test = json.loads((project / f"results/eval/{model}/test.json").read_text())
        assert "max_prob" in test["metrics"]["selective"]["aurc"]
    predictions = pd.read_parquet(project / "results/eval/s_hydra/ood.predictions.parquet")
    assert {"ood_label", "pred", "epistemic", "mc_epistemic"} <= set(predictions.columns)
    assert set(predictions["ood_label"]) == {"tech"}
    table = pd.read_csv(project / "results/report/ood.tsv", sep="\t")
    assert set(table["model"]) >= {"ens", "s_hydra", "s_vkd"}
    assert "OOD" in (project / "results/report/landing.html").read_text()


def test_changing_mc_samples_reruns_only_the_evaluations(held_out):
    project, env, _ = held_out
    config = yaml.safe_load((project / CONFIG).read_text())
    config["evaluate"]["mc_samples"] = 3
    (project / "tests/configs/more_samples.yaml").write_text(yaml.safe_dump(config))
    rules = {rule for rule, _ in planned_jobs(project, env, configfile="tests/configs/more_samples.yaml")}
    assert rules == {"evaluate", "evaluate_ensemble", "report"}


def test_an_external_ood_file_is_prepared_by_its_own_job_that_every_evaluation_reads(held_out):
    project, env, _ = held_out
    pd.DataFrame({"text": ["a text about nothing the data has", "another one"]}).to_csv(
        project / "ood.csv", index=False
    )
    config = yaml.safe_load((project / CONFIG).read_text())
    config["evaluate"]["ood"] = {"source": "ood.csv"}
    (project / "tests/configs/ood_file.yaml").write_text(yaml.safe_dump(config))
    text = snakemake(project, env, "--dry-run", configfile="tests/configs/ood_file.yaml")
    assert "rule ood:" in text
    assert text.count("--ood results/ood/tiny_ood") == 4  # the models that run inference; the ensemble does not
