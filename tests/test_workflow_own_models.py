"""End to end with models a user brings: a teacher imported from a fine-tuned RoBERTa checkpoint (byte-level BPE,
its head in another order and case than the data's labels), a teacher trained from a RoBERTa backbone, and
WordPiece students distilled from their cached logits; a method that compares tokens refuses the pair."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests.test_workflow import finished_project, planned_jobs, snakemake
from tests.tiny_models import tiny_roberta

pytestmark = pytest.mark.slow

LOGIT_STUDENTS = ("s_vkd", "s_uhc", "s_muki", "s_muki_no_mc")


def write_config(project):
    tiny_roberta(project / "models/roberta")
    tiny_roberta(project / "models/ckpt", ["Entertainment", "business"], seed=1)
    config = yaml.safe_load((project / "tests/configs/tiny.yaml").read_text())
    config["teacher_defaults"]["backbone"] = "models/roberta"
    config["teachers"] = {
        "ta": {"checkpoint": "models/ckpt", "finetune": False},
        "tb": {"classes": {"slice": 1, "of": 2}, "epochs": 1},
    }
    config["students"] = {
        "s_vkd": {"method": "vanilla_kd", "lr": 1e-3},
        "s_uhc": {"method": "uhc", "lr": 1e-3},
        "s_muki": {"method": "muki", "lr": 1e-3},
        "s_muki_no_mc": {"method": "muki_no_mc", "lr": 1e-3},
        "s_dfa": {"method": "dfa", "lr": 1e-3},
    }
    (project / "tests/configs/own.yaml").write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    """The workflow run once with --keep-going: everything but the DFA student finishes."""
    project, env, base = finished_project(
        tmp_path_factory, "own_models", "--dry-run", configfile="tests/configs/own.yaml", setup=write_config
    )
    planned = planned_jobs(project, env, configfile="tests/configs/own.yaml")
    run = snakemake(project, env, "--keep-going", configfile="tests/configs/own.yaml", check=False)
    return project, planned, run, base


def test_the_checkpoint_teacher_is_imported_not_trained(own):
    project, planned, _, _ = own
    assert ("import_teacher", "teacher=ta") in planned and ("finetune_teacher", "teacher=tb") in planned
    assert not any(rule == "finetune_teacher" and "ta" in wildcards for rule, wildcards in planned)
    teacher = project / "results/teachers/ta"
    assert json.loads((teacher / "labels.json").read_text()) == ["entertainment", "business"]  # head order kept
    manifest = json.loads((teacher / "manifest.json").read_text())
    assert manifest["imported"] is True and "epochs" not in manifest["config"]
    logits = json.loads((project / "results/signals/ta/train/logits.json").read_text())
    assert logits["labels"] == ["entertainment", "business"]


def test_wordpiece_students_learn_from_byte_level_bpe_teachers(own):
    project, _, _, _ = own
    test = pd.read_parquet(project / "results/data/tiny_bbc/test.parquet")
    for student in LOGIT_STUDENTS:
        evaluation = json.loads((project / f"results/eval/{student}/test.json").read_text())
        assert 0 <= evaluation["metrics"]["accuracy"] <= 1
        predictions = pd.read_parquet(project / f"results/eval/{student}/test.predictions.parquet")
        assert len(predictions) == len(test)  # a student predicts every class, whichever teacher taught it

    # the students tokenise with WordPiece, the teachers with byte-level BPE
    def tokenizer_type(folder):
        return json.loads((project / "results" / folder / "tokenizer.json").read_text())["model"]["type"]

    assert tokenizer_type("students/s_vkd") == "WordPiece"
    assert tokenizer_type("teachers/ta") == tokenizer_type("teachers/tb") == "BPE"


def test_a_method_that_compares_tokens_refuses_other_tokenizers(own):
    project, _, run, _ = own
    assert run.returncode != 0
    log = (project / "results/logs/distill/s_dfa.log").read_text()
    assert "dumped with another tokenisation than the student's" in log
    assert "give the student the teacher's tokenizer and max_length" in log
    assert not (project / "results/students/s_dfa").exists()
