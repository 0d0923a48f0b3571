"""The report's views beyond the summary table: training curves, confusion matrices and accuracy per class, cost
against accuracy with its Pareto front, and the HTML pages (summary.html, the landing fragment), on hand-made
evaluations, predictions and training logs whose expected content is computed by hand."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from kdpipe.core.store import write_json
from kdpipe.evaluation.metrics import reliability_bins
from kdpipe.report import build_report
from kdpipe.report.cost import pareto_front
from kdpipe.report.curves import read_curve
from kdpipe.report.errors import confusion
from kdpipe.report.html import _landing_caveats
from tests.conftest import REPO

CLASSES = ["a", "b", "c"]


def _write_model(root, model, kind, method, classes, gold, pred, params, seconds, seed=0, base=None):
    """An evaluation JSON with its predictions beside it (gold and predicted class per row)."""
    probs = np.full((len(gold), len(classes)), 0.1)
    probs[np.arange(len(gold)), [classes.index(p) for p in pred]] = 0.8
    labels = np.array([classes.index(g) for g in gold])
    correct = np.array(gold) == np.array(pred)
    per_class = {c: float(correct[np.array(gold) == c].mean()) for c in classes}
    folder = root / "eval" / model
    folder.mkdir(parents=True)
    pd.DataFrame({"row_id": range(len(gold)), "label": gold, "pred": pred, "correct": correct}).to_parquet(
        folder / "test.predictions.parquet"
    )
    accuracy = float(correct.mean())
    metrics = {"n": len(gold), "accuracy": accuracy, "macro_f1": accuracy, "nll": 1 - accuracy}
    metrics.update(ece=0.1 * (1 - accuracy), brier=0.2, reliability=reliability_bins(probs, labels))
    record = {
        "model": model, "base": base or model, "kind": kind, "method": method, "seed": seed, "split": "test",
        "params": params, "train_time_s": 60.0, "inference_time_s": seconds, "classes": classes,
        "device": "CPU, 2 threads", "batch_size": 64, "metrics": {**metrics, "per_class_accuracy": per_class},
    }  # fmt: skip
    write_json(folder / "test.json", record)
    return folder / "test.json"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("views")
    gold = ["a"] * 4 + ["b"] * 4 + ["c"] * 2
    evals = [
        # a teacher of classes a, b: its own rows only, all right
        _write_model(root, "t_ab", "teacher", None, ["a", "b"], gold[:8], gold[:8], 20_000_000, 0.8),
        # a student: 3/4 of a, 2/4 of b (two b rows predicted as c), both c rows
        _write_model(
            root,
            "small",
            "student",
            "vanilla_kd",
            CLASSES,
            gold,
            ["a", "a", "a", "b", "b", "b", "c", "c", "c", "c"],
            5_000_000,
            0.1,
        ),  # fmt: skip
        # a larger student, all right: on the front with `small` (cheaper but worse)
        _write_model(root, "large", "student", "supervised", CLASSES, gold, gold, 9_000_000, 0.2),
        # dominated: as large as `large` and worse than `small`
        _write_model(root, "bad", "student", "uhc", CLASSES, gold, ["c"] * 10, 9_000_000, 0.3),
    ]
    logs = []
    for model, lines in {
        # as the training loop logs: every 10 steps, the step counted from 0 in each epoch
        "t_ab": [
            {"epoch": 1, "step": 0, "loss": 1.0},
            {"epoch": 1, "step": 10, "loss": 0.5},
            {"epoch": 1, "validation": {"accuracy": 0.9, "nll": 0.3}, "best": True},
            {"epoch": 2, "step": 0, "loss": 0.45},
            {"epoch": 2, "step": 10, "loss": 0.4},
            {"epoch": 2, "validation": {"accuracy": 0.9, "nll": 0.4}, "best": False},
        ],
        "small": [
            {"epoch": 1, "step": 0, "loss": 2.0},
            {"epoch": 1, "step": 10, "loss": 1.8},
            {"epoch": 1, "validation": {"accuracy": 0.5, "nll": 1.0}, "best": True},
            {"epoch": 2, "step": 0, "loss": 9.0},  # the line a resumed job wrote again: the later one wins
            {"epoch": 2, "step": 0, "loss": 1.5},
            {"epoch": 2, "step": 10, "loss": 1.2},
            {"epoch": 2, "validation": {"accuracy": 0.7, "nll": 0.8}, "best": True},
        ],
    }.items():
        folder = root / ("teachers" if model.startswith("t_") else "students") / model
        folder.mkdir(parents=True)
        (folder / "train_log.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        logs.append(folder / "train_log.jsonl")
    out = root / "report"
    build_report(evals, out, train_logs=logs, title="Distillation on toy")
    return root, out, evals, logs


def test_curves_read_the_kept_epoch_and_the_last_line_of_a_step(report):
    _, _, _, logs = report
    teacher, student = (read_curve(path) for path in logs)
    assert (teacher.model, teacher.family, teacher.kept) == ("t_ab", "teachers", 1)  # epoch 2 tied, not kept
    # every epoch's steps count, at the fractional epoch epoch - 1 + step / 11 (11 steps an epoch, as logged)
    assert teacher.steps.tolist() == pytest.approx([0, 10 / 11, 1, 1 + 10 / 11])
    assert teacher.loss.tolist() == [1.0, 0.5, 0.45, 0.4]
    assert student.kept == 2 and student.loss.tolist() == [2.0, 1.8, 1.5, 1.2]
    assert student.accuracy.tolist() == [0.5, 0.7]


def test_training_logs_in_tensorboard_format(report):
    """Each log becomes a TensorBoard run: the last line of a step wins, as in curves.png, and the kept epoch is
    marked; a rebuilt report replaces the events instead of adding a second copy of every run."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, out, evals, logs = report

    def scalars(run):
        events = EventAccumulator(str(out / "tensorboard" / run)).Reload()
        return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}

    student = scalars("students/small")
    assert student["train/loss"] == [(0, 2.0), (10, pytest.approx(1.8)), (11, 1.5), (21, pytest.approx(1.2))]
    assert student["validation/accuracy"] == [(1, 0.5), (2, pytest.approx(0.7))]
    assert student["validation/kept"] == [(1, 0.0), (2, 1.0)]
    assert scalars("teachers/t_ab")["validation/kept"] == [(1, 1.0), (2, 0.0)]
    for _ in range(2):
        build_report(evals, root / "rebuilt", train_logs=logs)
    assert len(list((root / "rebuilt/tensorboard/students/small").iterdir())) == 1
    # the report runs no model: writing the events imports no torch (seconds of start-up)
    code = (
        "import sys; from pathlib import Path; from kdpipe.report.tensorboard import write_tensorboard; "
        f"assert write_tensorboard({[str(log) for log in logs]!r}, Path({str(root / 'fresh')!r})); "
        "print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr


def test_confusion_counts_gold_against_predicted(report):
    _, _, evals, _ = report
    counts = confusion([str(evals[1])], CLASSES)
    assert counts.tolist() == [[3, 1, 0], [0, 2, 2], [0, 0, 2]]
    # seeds pool: the same predictions twice count twice
    assert confusion([str(evals[1])] * 2, CLASSES).sum() == 20


def test_pareto_front_by_hand():
    cost = np.array([5.0, 9.0, 9.0, 2.0, np.nan])
    accuracy = np.array([0.8, 1.0, 0.5, 0.6, 0.99])
    # by cost: 2.0 (0.6) -> 5.0 (0.8) -> 9.0 (1.0); 9.0 at 0.5 is dominated, NaN is left out
    assert pareto_front(cost, accuracy).tolist() == [3, 0, 1]


def test_every_view_is_written(report):
    _, out, _, _ = report
    for name in ("curves.png", "confusion.png", "cost.png", "summary.html", "landing.html"):
        assert (out / name).read_bytes()[:4] in (b"\x89PNG", b"<!DO", b"<sty"), name


def test_per_class_table_keeps_a_teacher_to_its_own_classes(report):
    _, out, _, _ = report
    text = (out / "summary.md").read_text()
    assert text.startswith("# Distillation on toy\n")
    section = text[text.index("### Accuracy (%) per class, test split") :]
    assert "| model | kind | a | b | c |" in section
    assert "| t_ab | teacher | 100.0 | 100.0 | — |" in section
    assert "| small | student | 75.0 | 50.0 | 100.0 |" in section


def test_summary_html_is_a_sortable_table_with_the_best_in_bold(report):
    _, out, _, _ = report
    page = (out / "summary.html").read_text()
    assert "<title>Distillation on toy</title>" in page
    assert page.count("<table>") == 2  # the comparison and the accuracy per class
    assert 'onclick="(function(th)' in page
    # the best full-label-space accuracy is `large` (100%), not the teacher's 100% on its own classes
    large = re.search(r"<tr><td[^>]*>large</td>.*?</tr>", page).group(0)
    assert '<td class="best" data-sort="1">100.0</td>' in large
    teacher = re.search(r"<tr><td[^>]*>t_ab</td>.*?</tr>", page).group(0)
    assert "best" not in teacher


def test_landing_fragment_compares_the_models_at_a_glance(report):
    _, out, _, _ = report
    fragment = (out / "landing.html").read_text()
    assert "<h2>Distillation on toy</h2>" in fragment
    assert all(f">{m}</td>" in fragment for m in ("t_ab", "small", "large", "bad"))
    # per-example inference time: small predicted 10 rows in 0.1 s
    small = re.search(r"<tr><td[^>]*>small</td>.*?</tr>", fragment).group(0)
    assert 'data-sort="10">10.00</td>' in small and ">5.0M</td>" in small and ">3/3</td>" in small
    assert ">2/3</td>" in re.search(r"<tr><td[^>]*>t_ab</td>.*?</tr>", fragment).group(0)  # a subset teacher
    # the caveats name this run's rows only: its subset teacher's 2/3, and no oracle (it has none)
    assert "A teacher of some of the classes (<i>classes</i> 2/3)" in fragment and "oracle" not in fragment
    full_only = pd.DataFrame({"classes": ["2/2", "2/2"], "n_classes": [2, 2], "kind": ["teacher", "student"]})
    assert _landing_caveats(full_only) == ""
    with_oracle = pd.DataFrame({"classes": ["1/2", "2/2"], "n_classes": [1, 2], "kind": ["teacher", "oracle"]})
    assert _landing_caveats(with_oracle) == (
        "A teacher of some of the classes (<i>classes</i> 1/2) is scored on its own classes' rows only. "
        "The teachers' oracle reads gold labels. "
    )
    # the key plots under the table, embedded: the fragment needs no other file
    embedded = re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="(\w+)"', fragment)
    assert [alt for _, alt in embedded] == ["metrics", "cost"]
    assert base64.b64decode(embedded[1][0]) == (out / "cost.png").read_bytes()


def test_the_teachers_oracle_predicts_each_row_with_its_owner(tmp_path):
    """Teacher ab (classes a, b) on rows 0 and 2, teacher c (class c, alone) on row 1: the oracle has the three
    rows in row order, each teacher's probabilities at its classes' positions, and the cost of both teachers."""
    from kdpipe.core.store import read_json
    from kdpipe.stages import evaluate_ensemble
    from tests.conftest import eval_settings

    members = []
    for name, classes, rows, labels, probs in (
        ("ab", ["a", "b"], [2, 0], ["b", "a"], [[0.3, 0.7], [0.4, 0.6]]),
        ("c", ["c"], [1], ["c"], [[1.0]]),
    ):
        table = pd.DataFrame({"row_id": rows, "label": labels, "probs": [np.array(p) for p in probs]})
        table.to_parquet(tmp_path / f"{name}.predictions.parquet")
        write_json(tmp_path / f"{name}.json", {"classes": classes, "params": 10, "inference_time_s": 1.0})
        members.append(tmp_path / f"{name}.predictions.parquet")
    params = eval_settings(model="oracle", kind="oracle", seed=None, members=["ab", "c"], combine="oracle",
                           splits=["test"], ece_bins=15)  # fmt: skip
    evaluate_ensemble.run(params, members, [tmp_path / "oracle.json"], [tmp_path / "oracle.parquet"])
    result, table = read_json(tmp_path / "oracle.json"), pd.read_parquet(tmp_path / "oracle.parquet")
    assert table["row_id"].tolist() == [0, 1, 2]
    assert np.allclose(np.stack(table["probs"]), [[0.4, 0.6, 0.0], [0.0, 0.0, 1.0], [0.3, 0.7, 0.0]])
    # row 0 (gold a) is predicted b: 2 of 3 right
    assert table["pred"].tolist() == ["b", "c", "b"] and result["metrics"]["accuracy"] == pytest.approx(2 / 3)
    assert result["classes"] == ["a", "b", "c"] and result["params"] == 20 and result["inference_time_s"] == 2.0
