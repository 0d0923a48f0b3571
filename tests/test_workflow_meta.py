"""End to end: Meta-KD on a generated multi-domain dataset: prototype scores, a meta-teacher beside a plain
teacher, the meta-teacher's attention / hidden-state / domain dumps, two-stage per-domain students (one reading
every attention head, one narrower reading head-averaged attentions through a projection) and a per-domain
vanilla-KD baseline; then what an edit reruns, read from Snakemake's dry-run job lists."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from kdpipe.signals.io import read_features
from tests.test_workflow import edited_config, finished_project, planned_jobs, signal_jobs, writes_csv

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/tiny_domains.yaml"
ITEMS = {
    "books": ["novel", "story", "author", "chapter", "plot"],
    "dvd": ["movie", "film", "actor", "scene", "director"],
    "kitchen": ["blender", "kettle", "pan", "knife", "toaster"],
}
WORDS = {"pos": ["great", "wonderful", "excellent", "lovely"], "neg": ["awful", "boring", "terrible", "poor"]}


def domain_dataset(per_domain: int = 30) -> pd.DataFrame:
    """Reviews of three domains (their own nouns), positive or negative (shared sentiment words), all distinct."""
    rows = []
    for domain, items in ITEMS.items():
        for i in range(per_domain):
            label = ("pos", "neg")[i % 2]
            words = WORDS[label]
            text = (
                f"review {i} of {domain}: the {items[i % 5]} was {words[i % 4]} and the {items[(i + 2) % 5]} "
                f"felt {words[(i + 1) % 4]}"
            )
            rows.append({"text": text, "label": label, "domain": domain})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    project, env, _ = finished_project(
        tmp_path_factory, "workflow_meta", configfile=CONFIG, setup=writes_csv("data/domains.csv", domain_dataset)
    )
    return project, env


def read(path):
    return json.loads(path.read_text())


def test_meta_kd_runs_end_to_end(done):
    project, _ = done
    r = project / "results"
    train = pd.read_parquet(r / "data/tiny_domains/train.parquet")
    # prototype scores: one per train row, in row order, of the un-fine-tuned backbone
    scores = pd.read_parquet(r / "prototypes/train.parquet")
    assert scores["row_id"].tolist() == train["row_id"].tolist() and scores["score"].between(-1, 1).all()
    assert read(r / "prototypes/train.json")["config"]["by"] == "domain_class"
    # the meta-teacher: its domain branch beside it; the plain teacher has none
    assert read(r / "teachers/meta/domain_branch.json")["domains"] == ["books", "dvd", "kitchen"]
    assert not (r / "teachers/plain/domain_branch.json").exists()
    # its dumps keep only the aligned layers: hidden states 0 and 2, attention layer 2 (all heads, and their mean)
    signals = r / "signals/meta/train"
    row_ids = train["row_id"].to_numpy()
    hidden, _, tokens, manifest = read_features(signals / "hidden.npy", row_ids)  # no padding: [T, layers, H]
    lengths = tokens["length"]
    assert manifest["layers"] == [0, 2] and hidden.shape == (lengths.sum(), 2, 32) and len(lengths) == len(train)
    attentions, offsets, _, manifest = read_features(signals / "attentions.npy", row_ids)
    assert manifest["layers"] == [2] and attentions.dtype == np.float16 and offsets[-1] == 2 * (lengths**2).sum()
    assert manifest["bytes"] == 2 * 2 * (lengths**2).sum() and manifest["heads"] == 2
    assert read_features(signals / "attentions_mean.npy", row_ids)[0].shape == ((lengths**2).sum(),)
    first = attentions[: offsets[1]].reshape(2, lengths[0], lengths[0])  # row 0: [heads, n, n]
    np.testing.assert_allclose(first[:, 0].astype(np.float32).sum(-1), 1, atol=1e-2)  # softmax rows
    domain = pd.read_parquet(signals / "domain.parquet")
    assert np.load(signals / "domain.npy").shape == (len(train), 32) and domain["row_id"].tolist() == row_ids.tolist()
    assert domain["expertise"].between(1 / (1 + np.e) - 1e-6, 0.5 + 1e-6).all()
    assert not (r / "signals/plain/train/hidden.npy").exists()  # vanilla KD reads logits only
    # the two stages: stage 2 starts from stage 1's weights; only stage 2 is evaluated, on its domain's rows
    assert read(r / "students/s_meta/manifest.json")["config"]["model"] == {
        "init": {"from": "results/students/s_meta.stage1"}
    }
    assert read(r / "students/s_meta.stage1/metrics.json")["best_epoch"] == 2  # the last epoch, not validated
    assert not (r / "eval/s_meta.stage1").exists()
    test = pd.read_parquet(r / "data/tiny_domains/test.parquet")
    for student, domain_name in (("s_meta", "books"), ("s_meta_narrow", "dvd"), ("s_vkd", "books")):
        evaluation = read(r / f"eval/{student}/test.json")
        assert (
            evaluation["domain"] == domain_name and evaluation["metrics"]["n"] == (test["domain"] == domain_name).sum()
        )
        assert list(evaluation["metrics"]["per_domain"]) == [domain_name]
    assert set(read(r / "eval/meta/test.json")["metrics"]["per_domain"]) == {"books", "dvd", "kitchen"}
    summary = (r / "report/summary.md").read_text()
    assert "Accuracy (%) per domain, test split" in summary and "| s_meta_narrow | student | meta_kd | dvd |" in summary


def evaluations(*models):
    return {("evaluate", f"model={m}") for m in models}  # (one job for both splits)


def test_a_second_stage_change_reruns_only_the_second_stage(done):
    project, env = done
    config = edited_config(
        project, lambda c: c["students"]["s_meta"]["method_args"].update(temperature=4.0), base=CONFIG
    )
    assert planned_jobs(project, env, config) == {("distill", "student=s_meta"), *evaluations("s_meta"), ("report", "")}


def test_a_first_stage_change_reruns_both_stages_of_that_student(done):
    project, env = done
    config = edited_config(
        project, lambda c: c["students"]["s_meta"]["method_args"]["stage1"].update(gamma=0.2), base=CONFIG
    )
    assert planned_jobs(project, env, config) == {
        ("distill", "student=s_meta.stage1"),
        ("distill", "student=s_meta"),
        *evaluations("s_meta"),
        ("report", ""),
    }


META_DOWNSTREAM = {
    *signal_jobs("meta", "logits", "domain", "hidden", "attentions", "attentions_mean"),
    *{("distill", f"student={s}") for s in ("s_meta.stage1", "s_meta", "s_meta_narrow.stage1", "s_meta_narrow")},
    *evaluations("meta", "s_meta", "s_meta_narrow"),
    ("report", ""),
}


def test_a_meta_teacher_change_reruns_its_dumps_and_students_only(done):
    project, env = done
    config = edited_config(project, lambda c: c["teachers"]["meta"]["objective_args"].update(gamma=0.2), base=CONFIG)
    assert planned_jobs(project, env, config) == {("finetune_teacher", "teacher=meta"), *META_DOWNSTREAM}


def test_a_prototype_change_reruns_the_meta_teacher_not_the_plain_one(done):
    project, env = done
    config = edited_config(project, lambda c: c["prototypes"].update(by="domain"), base=CONFIG)
    assert planned_jobs(project, env, config) == {
        ("prototypes", ""),
        ("finetune_teacher", "teacher=meta"),
        *META_DOWNSTREAM,
    }
