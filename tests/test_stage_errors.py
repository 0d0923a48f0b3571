"""Bad input through the stage CLI: a clear message naming the key, class or file, exit status 2, no output."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import make_manifest, write_json
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.routing import ROUTE_SPLITS as SPLITS
from kdpipe.routing.artifact import FILES, write_scores
from kdpipe.signals.io import write_logits
from tests.conftest import TINY_TEACHER, student_job, student_settings

STUDENT = {
    "method": "vanilla_kd",
    "method_args": {},
    "model": {
        "config": {
            "tokenizer": "builtin:tiny-bert",
            "hidden_size": 32,
            "num_layers": 1,
            "num_heads": 2,
            "intermediate_size": 64,
        }
    },
    "epochs": 1,
    "lr": 1e-3,
    "batch_size": 8,
    "eval_batch_size": 32,
    "max_length": 32,
    "seed": 0,
    "checkpoint_every": 0,
}


def kdpipe(*args):
    return subprocess.run([sys.executable, "-m", "kdpipe", *args], capture_output=True, text=True)


def fake_signals(root, data, teachers: dict[str, list[str]], mc: bool = False):
    """Cached signals of each teacher on the train split, laid out as the logits and mc passes write them."""
    row_ids = read_split(data, "train")["row_id"].to_numpy()
    rng = np.random.default_rng(0)
    for name, classes in teachers.items():
        d = root / name / "train"
        d.mkdir(parents=True)
        logits = rng.normal(size=(len(row_ids), len(classes))).astype(np.float32)
        write_logits(d / "logits.parquet", row_ids, logits)
        write_json(d / "logits.json", make_manifest("logits", split="train", rows=len(row_ids), labels=classes))
        if mc:
            probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
            np.save(d / "mc.npy", probs)
            pd.DataFrame(
                {
                    "row_id": row_ids,
                    "entropy": 0.5,
                    "certainty": rng.uniform(size=len(row_ids)),
                    "max_prob": probs.max(1),
                    "variance": 0.01,
                }
            ).to_parquet(d / "mc.parquet")
            write_json(d / "mc.json", make_manifest("mc", split="train", rows=len(row_ids), labels=classes))


def fake_route(folder, data, teachers: list[str]):
    """A route artifact giving every teacher the same score on every row (softmax weighting: equal weights)."""
    folder.mkdir(parents=True)
    for split in SPLITS:
        row_ids = read_split(data, split)["row_id"].to_numpy()
        write_scores(folder / f"{split}.parquet", row_ids, np.zeros((len(row_ids), len(teachers)), np.float32))
    manifest = make_manifest(
        "route", teachers=teachers, router="certainty-entropy", weighting="softmax", gold_labels={}
    )  # (a certainty router reads no gold label, as a route job records)
    write_manifest(folder / FILES[-1], manifest, list(FILES[:-1]))
    return folder


def test_teacher_class_not_in_the_data(tiny_data, tmp_path):
    out = tmp_path / "teacher"
    r = kdpipe(
        "finetune-teacher",
        "--params",
        json.dumps({**TINY_TEACHER, "classes": ["sport", "sports"]}),
        "--data",
        str(tiny_data),
        "--out",
        str(out),
    )
    assert r.returncode == 2
    assert "class 'sports' is not in the data" in r.stderr and "Traceback" not in r.stderr
    assert not out.exists()


def test_label_that_no_teacher_covers(tiny_data, tmp_path):
    labels = read_labels(tiny_data)
    fake_signals(tmp_path / "signals", tiny_data, {"t1": labels[:2], "t2": labels[2:4]})
    out = tmp_path / "student"
    r = kdpipe(
        "distill",
        "--params",
        json.dumps(student_job({**STUDENT, "teachers": ["t1", "t2"]})),
        "--data",
        str(tiny_data),
        "--signals-root",
        str(tmp_path / "signals"),
        "--out",
        str(out),
    )
    assert r.returncode == 2
    assert f"label '{labels[4]}' in the data is covered by no teacher" in r.stderr
    assert not out.exists()


def test_overlapping_teachers_where_the_method_needs_them_disjoint(tiny_data, tmp_path):
    labels = read_labels(tiny_data)
    fake_signals(tmp_path / "signals", tiny_data, {"t1": labels[:3], "t2": labels[2:]})
    r = kdpipe(
        "distill",
        "--params",
        json.dumps(student_job({**STUDENT, "teachers": ["t1", "t2"]})),
        "--data",
        str(tiny_data),
        "--signals-root",
        str(tmp_path / "signals"),
        "--out",
        str(tmp_path / "student"),
    )
    assert r.returncode == 2
    assert f"overlap on class '{labels[2]}'" in r.stderr and "disjoint or identical" in r.stderr


def test_missing_signal_names_the_file(tiny_data, tmp_path):
    labels = read_labels(tiny_data)
    fake_signals(tmp_path / "signals", tiny_data, {"t1": labels})
    r = kdpipe(
        "distill",
        "--params",
        json.dumps(student_job({**STUDENT, "teachers": ["t1", "t9"]})),
        "--data",
        str(tiny_data),
        "--signals-root",
        str(tmp_path / "signals"),
        "--out",
        str(tmp_path / "student"),
    )
    assert r.returncode == 2 and "t9/train/logits.json: missing" in r.stderr


@pytest.mark.parametrize("method", ["vanilla_kd", "uhc", "muki", "muki_no_mc"])
def test_distill_reads_only_cached_signals_and_trains(tiny_data, tmp_path, monkeypatch, method):
    """A student trains from the cache alone: loading any pretrained model (a teacher) fails the test."""
    from transformers import PreTrainedModel

    from kdpipe.stages import distill

    labels = read_labels(tiny_data)
    fake_signals(tmp_path / "signals", tiny_data, {"t1": labels[:2], "t2": labels[2:]}, mc=True)

    def no_teacher(*a, **k):
        raise AssertionError("distill loaded a pretrained model")

    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(no_teacher))
    out = tmp_path / "student"
    params = student_settings({**STUDENT, "method": method, "teachers": ["t1", "t2"]})
    route = fake_route(tmp_path / "route", tiny_data, ["t1", "t2"]) if method.startswith("muki") else None
    manifest = distill.run(params, tiny_data, tmp_path / "signals", out, route=route)
    assert manifest["labels"] == labels and manifest["method"] == method
    assert (out / "model.safetensors").exists() and (out / "train_log.jsonl").exists()
    assert json.loads((out / "labels.json").read_text()) == labels
