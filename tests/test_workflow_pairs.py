"""End to end on a generated sentence-pair dataset: ProKT's cotrain rule (a transformer and a BiLSTM student, each
with the teacher trained beside it), and the BiLSTM student distilled from cached signals by the logit-level
methods (signals are keyed by row_id, not by token: the BiLSTM encodes the two sides of a pair apart)."""

from __future__ import annotations

import hashlib

import pandas as pd
import pytest
from safetensors.torch import load_file

from kdpipe.models.loading import load_classifier
from tests.test_workflow import edited_config, finished_project, planned_jobs, snakemake, writes_csv

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/tiny_pairs.yaml"
PROKT = ("s_prokt", "s_prokt_bilstm")
BILSTM = ("s_prokt_bilstm", "s_bilstm_vkd", "s_bilstm_muki", "s_bilstm_dd")
WORDS = ["river", "market", "guitar", "planet", "garden", "engine", "winter", "castle"]


def pair_dataset(rows: int = 72) -> pd.DataFrame:
    """Premise/hypothesis pairs with four labels (two per subset teacher): the hypothesis repeats the premise's word
    (same), names another word (other), negates the premise's word (negated) or asks about it (question)."""
    out = []
    for i in range(rows):
        word, other = WORDS[i % len(WORDS)], WORDS[(i * 3 + 1) % len(WORDS)]
        label = ("same", "other", "negated", "question")[i % 4]
        hypothesis = {
            "same": f"it is about the {word}",
            "other": f"it is about the {other}",
            "negated": f"it is not about the {word}",
            "question": f"is it about the {word}",
        }[label]
        out.append(
            {"premise": f"example {i} tells a story of the {word} near town", "hypothesis": hypothesis, "label": label}
        )
    return pd.DataFrame(out)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    project, env, _ = finished_project(
        tmp_path_factory, "workflow_pairs", configfile=CONFIG, setup=writes_csv("data/pairs.csv", pair_dataset)
    )
    return project, env


def test_pairs_prokt_and_bilstm_students_run_end_to_end(done):
    project, _ = done
    r = project / "results"
    assert set(pd.read_parquet(r / "data/tiny_pairs/train.parquet").columns) >= {"text", "text_pair"}
    summary = pd.read_csv(r / "report/summary.tsv", sep="\t")
    students = {"s_prokt", "s_prokt_bilstm", "s_bilstm_vkd", "s_bilstm_muki", "s_bilstm_dd"}
    assert set(summary["model"]) == {"ta", "tb", "tfull", *students, "s_prokt.teacher", "s_prokt_bilstm.teacher"}
    methods = summary.drop_duplicates("model").set_index("model")["method"]
    assert methods["s_prokt.teacher"] == "prokt" and methods["s_bilstm_dd"] == "dynamic_data"
    for student in BILSTM:
        assert (r / f"students/{student}/bilstm.json").exists(), student
    # the co-trained teachers are artifacts of their own, over all labels, evaluated like any teacher
    for student in PROKT:
        assert (r / f"cotrained/{student}/model.safetensors").exists()
        assert (r / f"eval/{student}.teacher/test.json").exists()
    assert (r / "logs/cotrain/s_prokt.log").exists() and not (r / "logs/distill/s_prokt.log").exists()


def test_cotrained_teacher_moved_from_its_pretrained_start(done):
    project, _ = done
    labels = ["negated", "other", "question", "same"]
    start = load_classifier("builtin:tiny-bert", labels, seed=0).state_dict()
    trained = load_file(str(project / "results/cotrained/s_prokt/model.safetensors"))
    key = "bert.encoder.layer.0.attention.self.query.weight"
    assert not pd.Series(start[key].flatten().numpy()).equals(pd.Series(trained[key].flatten().numpy()))
    assert trained["classifier.weight"].abs().sum() > 0  # started at zero, learnt


def test_prokt_change_reruns_only_that_student_and_its_teacher(done):
    project, env = done
    config = edited_config(
        project, lambda c: c["students"]["s_prokt"]["method_args"].update(move_back_weight=0.5), base=CONFIG
    )
    assert planned_jobs(project, env, config) == {
        ("cotrain", "student=s_prokt"),
        ("evaluate", "model=s_prokt"),
        ("evaluate", "model=s_prokt.teacher"),
        ("report", ""),
    }


def test_a_frozen_teacher_is_never_written_by_distillation(done):
    """(Last: it reruns the distill jobs, which outdates their evaluations for any later dry-run.)"""
    project, env = done
    weights = project / "results/teachers/ta/model.safetensors"
    before = hashlib.sha256(weights.read_bytes()).hexdigest()
    out = snakemake(project, env, "--forcerun", "distill", "--until", "distill", configfile=CONFIG)
    assert "rule distill:" in out and "rule finetune_teacher:" not in out
    assert hashlib.sha256(weights.read_bytes()).hexdigest() == before
