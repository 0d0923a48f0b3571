"""End to end with prompted LLM teachers (docs/methods.md §7) on a tiny random causal LM built in-process: the
model's import, the prompt passes on every split (the transfer rows' too), the teachers' evaluation and report rows,
a MUKI student routed by the prompt ensembles' certainty and a vanilla KD student, all from ONE finished run; then
dry-runs read to check that an edit of a prompt reruns that teacher's passes and what reads them, and nothing else,
a sharded pass gathered into the same bytes, and a bad prompt stopped in one line before any job."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pytest

from kdpipe.plan.prompted import llm_name
from tests.test_workflow import edited_config, finished_project, planned_jobs, snakemake

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/tiny_llm.yaml"
SPLITS = ("train", "validation", "test", "transfer")  # every split some job reads (transfer: the unlabelled rows)
STUDENTS = ("s_vkd", "s_muki")  # both learn from both teachers
ROUTE = "route=llm_a+llm_b.certainty-entropy"


def tiny_llms(project) -> None:
    """The tiny random causal LM the config names (data/tiny-llm), and another (data/tiny-llm-2) for an edit."""
    from tests.test_llm_teacher import chat_tokenizer, tiny_causal_lm

    for seed, name in enumerate(("tiny-llm", "tiny-llm-2")):
        folder = project / "data" / name
        tiny_causal_lm(seed=seed).save_pretrained(folder)
        chat_tokenizer().save_pretrained(folder)


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    project, env, _ = finished_project(tmp_path_factory, "workflow_llm", configfile=CONFIG, setup=tiny_llms)
    return project, env


def teacher_jobs(teacher: str) -> set[tuple[str, str]]:
    """A prompted teacher's passes and evaluation, and everything that reads them in the tiny config."""
    return {
        *{("prompt_pass", f"teacher={teacher}, split={split}") for split in SPLITS},
        ("evaluate_prompted", f"model={teacher}"),
        ("route", ROUTE),
        ("route_transfer", ROUTE),
        *{("distill", f"student={s}") for s in STUDENTS},
        *{("evaluate", f"model={s}") for s in STUDENTS},
        ("report", ""),
    }


def test_prompted_teachers_run_end_to_end(done):
    project, _ = done
    r = project / "results"
    llm = r / "llm" / llm_name("data/tiny-llm")
    manifest = json.loads((llm / "manifest.json").read_text())
    assert manifest["kind"] == "causal_lm" and (llm / "model.safetensors").exists()
    assert manifest["config"]["source"] == "data/tiny-llm" and "local_content" in manifest["config"]
    for teacher in ("llm_a", "llm_b"):
        for split in SPLITS:
            for name in ("logits.parquet", "mc.npy", "mc.parquet", "mc.json", "pooled.npy", "prompt.npy"):
                assert (r / "signals" / teacher / split / name).exists(), (teacher, split, name)
    mc = json.loads((r / "signals/llm_b/train/mc.json").read_text())
    assert mc["ensemble"] == "prompt" and mc["members"] == ["t0.v0.d0", "t0.v0.d1"]
    summary = pd.read_csv(r / "report/summary.tsv", sep="\t")
    assert set(summary["model"]) == {"llm_a", "llm_b", *STUDENTS}
    assert set(summary.loc[summary["model"].isin(["llm_a", "llm_b"]), "kind"]) == {"teacher"}
    assert (r / "report/uncertainty.png").exists()  # the prompt ensembles' spread: an uncertainty split
    route = json.loads((r / "routes/llm_a+llm_b.certainty-entropy/route.json").read_text())
    assert {"knn", "certainty/mutual_info"} <= set(route["diagnostics"])  # (knn: on the LLM's pooled states)
    for student in STUDENTS:
        assert json.loads((r / f"eval/{student}/test.json").read_text())["kind"] == "student"


@pytest.mark.parametrize("teacher", ["llm_a", "llm_b"])
def test_a_prompted_teacher_is_evaluated_from_its_passes(done, teacher):
    """Its record is its prompt members' mean on its own classes' rows; its label use is its few-shot examples."""
    project, _ = done
    r = project / "results"
    record = json.loads((r / f"eval/{teacher}/test.json").read_text())
    prompt = json.loads((r / f"signals/{teacher}/test/prompt.json").read_text())
    assert record["members"] == len(prompt["members"]) == 2 and record["classes"] == prompt["labels"]
    read = {row for rows in prompt["shots"].values() for row in rows}
    assert record["gold_labels"] == {"train": len(read), "checkpoint": "trained outside kdpipe"}
    # llm_a: 1 shot of each of its 2 classes; llm_b: 2 draws of 1 shot of each of its 3 classes, which may share rows
    assert len(read) == 2 if teacher == "llm_a" else 3 <= len(read) <= 6
    test = pd.read_parquet(r / "data/tiny_bbc/test.parquet")
    logits = pd.read_parquet(r / f"signals/{teacher}/test/logits.parquet")
    assert np.array_equal(logits["row_id"], test["row_id"])
    own = test["label"].isin(record["classes"]).to_numpy()
    predicted = np.stack(logits["logits"].to_numpy())[own].argmax(1)
    gold = test.loc[own, "label"].map({c: i for i, c in enumerate(record["classes"])}).to_numpy()
    assert record["metrics"]["accuracy"] == pytest.approx((predicted == gold).mean())


@pytest.mark.parametrize(
    ("teacher", "edit", "imported"),
    [
        ("llm_a", lambda p: p["templates"].__setitem__(1, "{text}\nThis article's topic, one of {labels}, is"), None),
        ("llm_b", lambda p: p["verbalizers"].__setitem__("sport", ["sport", "football"]), None),
        ("llm_a", lambda p: p.__setitem__("shots", 2), None),
        ("llm_b", lambda p: p.__setitem__("model", "data/tiny-llm-2"), "data/tiny-llm-2"),
    ],
    ids=["template", "verbalizer", "shots", "model"],
)
def test_a_prompt_edit_reruns_that_teachers_passes_and_what_reads_them(done, teacher, edit, imported):
    """Only the edited teacher's passes rerun (and a new model's import), with what reads them; the other
    teacher's passes, and the shared model's import, stay."""
    project, env = done
    config = edited_config(project, lambda c: edit(c["teachers"][teacher]["prompt"]), base=CONFIG, name="llm.yaml")
    expected = teacher_jobs(teacher) | ({("llm_import", f"llm={llm_name(imported)}")} if imported else set())
    assert planned_jobs(project, env, config) == expected


def test_a_student_edit_reruns_no_llm_pass(done):
    project, env = done
    config = edited_config(project, lambda c: c["students"]["s_vkd"].update(lr=2.0e-3), base=CONFIG, name="llm.yaml")
    assert planned_jobs(project, env, config) == {
        ("distill", "student=s_vkd"),
        ("evaluate", "model=s_vkd"),
        ("report", ""),
    }


def test_a_sharded_pass_is_the_same_bytes(done, tmp_path):
    """S = 2 shards and a gather (--set-scatter dump=2) write the files of the whole pass, byte for byte (in a copy
    of the finished run, so that the other tests' run stays as it was)."""
    project, env = done
    copy = tmp_path / "copy"
    shutil.copytree(project, copy)
    folder = "results/signals/llm_b/validation"
    out = snakemake(
        copy,
        {**env, "PYTHONPATH": str(copy)},
        "--set-scatter",
        "dump=2",
        "--forcerun",
        "prompt_gather",
        "--until",
        "prompt_gather",
        "--",
        f"{folder}/prompt.npy",
        configfile=CONFIG,
    )
    assert "prompt_shard" in out and "2-of-2" in out
    for name in ("logits.parquet", "mc.npy", "mc.parquet", "pooled.npy", "prompt.npy"):
        assert (copy / folder / name).read_bytes() == (project / folder / name).read_bytes(), name


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda c: c["teachers"]["llm_a"]["prompt"].update(templates=["Classify: {labels}"]),
            "config: teachers.llm_a.prompt.templates[0]: the template needs the row's text slot {text} exactly once",
        ),
        (
            lambda c: c["students"]["s_vkd"].update(method="dfa"),
            "config: students.s_vkd: method 'dfa' reads the teachers' hidden signal, which a prompted teacher (llm_a) "
            "does not have",
        ),
    ],
    ids=["template", "token-level-method"],
)
def test_a_bad_prompted_config_stops_in_one_line_before_any_job(done, edit, message):
    project, env = done
    config = edited_config(project, edit, base=CONFIG, name="bad_llm.yaml")
    result = snakemake(project, env, "--dry-run", configfile=config, check=False)
    assert result.returncode != 0 and message in result.stderr + result.stdout
