"""The report's serving table and the cost plot's latencies (kdpipe/report/serving.py, kdpipe/report/cost.py), on
hand-made evaluations and serving profiles whose expected speed-ups and kept accuracies are computed by hand."""

from __future__ import annotations

import pandas as pd
import pytest

from kdpipe.core.store import KdpipeError, read_json, write_json
from kdpipe.report import build_report
from kdpipe.report.cost import _measured_on, _time_axis, pareto_front
from kdpipe.report.serving import read_profiles, serving_markdown, serving_table, with_serving_latency
from kdpipe.report.summary import check_eval, runs_table, summarise
from tests.test_report_views import CLASSES, _write_model

GOLD = ["a"] * 4 + ["b"] * 4 + ["c"] * 2  # 10 rows
# accuracy: teacher 10/10, student 8/10, its ONNX export 8/10, its int8 version 7/10
PREDICTED = {
    "teacher": GOLD,
    "s": ["a", "a", "a", "a", "b", "b", "b", "b", "a", "a"],
    "s.onnx": ["a", "a", "a", "a", "b", "b", "b", "b", "a", "a"],
    "s.int8": ["a", "a", "a", "b", "b", "b", "b", "b", "a", "a"],
}


def _profile(root, model, kind, fmt, precision, median, peak=300.0, weights=60.0):
    profile = {
        "model": model, "kind": kind, "format": fmt, "precision": precision,
        "latency_ms": {"batch_size": 1, "requests": 100, "warmup": 10, "median": median, "p95": 1.5 * median},
        "throughput": {"batch_size": 32, "texts": 110, "texts_per_s": 1000.0 / median},
        "memory": {"peak_rss_mb": peak, "rss_before_load_mb": 100.0, "model_mb": peak - 100.0},
        "size": {"weights_mb": weights, "folder_mb": weights + 1}, "threads": 2, "device": "CPU (test)",
    }  # fmt: skip
    write_json(root / f"{model}.json", profile)
    return root / f"{model}.json"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    evals = [
        _write_model(root, "teacher", "teacher", None, CLASSES, GOLD, PREDICTED["teacher"], 22_700_000, 0.4),
        _write_model(root, "s", "student", "vanilla_kd", CLASSES, GOLD, PREDICTED["s"], 15_600_000, 0.2),
        _write_model(root, "s.onnx", "student", "vanilla_kd", CLASSES, GOLD, PREDICTED["s.onnx"], 15_600_000, 0.15),
        _write_model(root, "s.int8", "student", "vanilla_kd", CLASSES, GOLD, PREDICTED["s.int8"], 15_600_000, 0.1),
        _write_model(root, "unprofiled", "student", "uhc", CLASSES, GOLD, GOLD[:9] + ["a"], 15_600_000, 0.3),
    ]
    profiles = [
        _profile(root, "teacher", "teacher", "pytorch", "fp32", 40.0, weights=90.8),
        _profile(root, "s", "student", "pytorch", "fp32", 16.0),
        _profile(root, "s.onnx", "onnx", "onnx", "fp32", 10.0),
        _profile(root, "s.int8", "onnx", "onnx", "int8", 4.0, peak=160.0, weights=15.7),
    ]
    summary = summarise(runs_table([check_eval(read_json(path), path) for path in evals]))
    return root, evals, profiles, summary


def test_speed_up_against_the_teacher_beside_the_accuracy_kept(run):
    _, _, profiles, summary = run
    table = serving_table(read_profiles(profiles), summary)
    assert list(table["model"]) == ["teacher", "s", "s.onnx", "s.int8"]
    assert list(table["speedup"]) == [1.0, 2.5, 4.0, 10.0]  # 40 ms over 40, 16, 10 and 4 ms
    assert list(table["accuracy"]) == [1.0, 0.8, 0.8, 0.7]
    assert list(table["accuracy_kept"]) == [1.0, 0.8, 0.8, 0.7]  # over the teacher's 100%
    assert table.attrs["reference"] == "teacher" and table.attrs["teachers"] == ["teacher"]
    text = serving_markdown(table)
    assert "| s.int8 | onnx int8 | 4.00 | 6.00 | 250.0 | 10.00x | 70.0 | 70.0 | 160 | 15.7 |" in text
    assert "Teacher side: teacher. Measured on: CPU (test), 2 threads." in text


def test_teachers_on_class_subsets_are_one_teacher_side_with_the_oracles_accuracy(tmp_path):
    evals = [
        _write_model(tmp_path, "t_ab", "teacher", None, ["a", "b"], GOLD[:8], GOLD[:8], 22_700_000, 0.3),
        _write_model(tmp_path, "t_c", "teacher", None, ["c"], GOLD[8:], GOLD[8:], 22_700_000, 0.1),
        _write_model(tmp_path, "oracle", "oracle", None, CLASSES, GOLD, GOLD[:9] + ["a"], 45_400_000, 0.4),
        _write_model(tmp_path, "s.int8", "student", "muki", CLASSES, GOLD, PREDICTED["s.int8"], 15_600_000, 0.1),
    ]
    summary = summarise(runs_table([check_eval(read_json(path), path) for path in evals]))
    profiles = read_profiles(
        [
            _profile(tmp_path, "t_ab", "teacher", "pytorch", "fp32", 30.0),
            _profile(tmp_path, "t_c", "teacher", "pytorch", "fp32", 30.0),
            _profile(tmp_path, "s.int8", "onnx", "onnx", "int8", 5.0),
        ]
    )
    table = serving_table(profiles, summary)
    row = table.set_index("model").loc["s.int8"]
    assert row["speedup"] == 12.0  # both teachers, one after another: 60 ms over 5 ms
    assert row["accuracy_kept"] == pytest.approx(0.7 / 0.9)  # over the oracle's 9/10
    assert table.attrs["reference"] == "oracle"
    named = serving_table(profiles, summary, teachers=["t_ab"], reference="t_ab")
    assert named.set_index("model").loc["s.int8", "speedup"] == 6.0
    with pytest.raises(KdpipeError, match="no serving profile of the teacher"):
        serving_table(profiles, summary, teachers=["t_x"])


def test_profiled_models_take_their_batch1_latency_onto_the_cost_plot(run):
    _, _, profiles, summary = run
    shown = with_serving_latency(summary, read_profiles(profiles))
    times = dict(zip(shown["model"], shown["inference_ms"]))
    assert times["s.int8"] == 4.0 and times["teacher"] == 40.0
    assert times["unprofiled"] == pytest.approx(1000 * 0.3 / 10)  # the evaluation's 0.3 s over 10 rows
    assert list(shown["time_source"]) == ["profile"] * 4 + ["evaluation"]
    label, names = _time_axis(shown, "inference time per example (ms)")
    assert label.startswith("batch-1 latency, median (ms); †") and names[-1] == "unprofiled †"
    assert _measured_on(shown).startswith("latency profiled on CPU (test), 2 threads; † inference on CPU, 2 threads")
    # the front by latency: s.int8 (4 ms, 70%) -> s.onnx (10 ms, 80%) -> unprofiled (30 ms, 90%) -> teacher (40 ms,
    # 100%); s (16 ms, 80%) is no better than s.onnx
    cost, accuracy = shown["inference_ms"].to_numpy(), shown["accuracy"].to_numpy()
    front = [shown["model"][i] for i in pareto_front(cost, accuracy)]
    assert front == ["s.int8", "s.onnx", "unprofiled", "teacher"]


def test_the_report_writes_the_serving_table_and_removes_a_stale_one(run):
    root, evals, profiles, _ = run
    out = root / "report"
    build_report(evals, out, serving=profiles)
    table = pd.read_csv(out / "serving.tsv", sep="\t")
    assert list(table["model"]) == ["teacher", "s", "s.onnx", "s.int8"] and list(table["speedup"]) == [1, 2.5, 4, 10]
    assert (out / "serving.md").read_text().startswith("# Serving profiles\n")
    assert (out / "cost.png").stat().st_size > 10_000
    build_report(evals, out)
    assert not (out / "serving.tsv").exists() and not (out / "serving.md").exists()
    with pytest.raises(KdpipeError, match="model 's' has two serving profiles"):
        build_report(evals, out, serving=[profiles[1], profiles[1]])


def test_a_profiled_seed_takes_its_students_row_and_only_seeds_profiled_still_make_a_report(run, tmp_path):
    """A seeded student is one row of the summary (the mean over its seeds): a profile of ``s.seed1`` or of
    ``s.seed1.int8`` takes the accuracy and the cost plot's latency of that row, and a report whose only profiles
    are of seeds is written."""
    root, evals, _, summary = run
    profiles = read_profiles(
        [
            _profile(tmp_path, "s.seed1", "student", "pytorch", "fp32", 16.0),
            _profile(tmp_path, "s.seed1.int8", "onnx", "onnx", "int8", 4.0),
        ]
    )
    table = serving_table(profiles, summary, teachers=[])
    assert list(table["accuracy"]) == [0.8, 0.7]  # the rows of s and s.int8
    shown = with_serving_latency(summary, profiles)
    times = dict(zip(shown["model"], shown["inference_ms"]))
    assert times["s"] == 16.0 and times["s.int8"] == 4.0
    assert with_serving_latency(summary.iloc[:0], profiles).empty  # nothing to place: no error
    build_report(evals, tmp_path / "report", serving=[tmp_path / "s.seed1.json"])
    assert "| s.seed1 | pytorch fp32 |" in (tmp_path / "report" / "serving.md").read_text()
