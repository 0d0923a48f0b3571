"""Progress you can see: bars in rows with rows/s and the time left, one line per redraw in a log file, and every
job's one-line summary printed by the command line (kdpipe/core/progress.py, kdpipe/cli.py)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import pyarrow
import torch

from kdpipe.cli import job_name, main
from kdpipe.core import progress
from kdpipe.data.batching import encode, model_inputs
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.models.inference import iterate
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.models.students import build_student
from kdpipe.training.loop import FitResult, TrainSettings, fit, save_trained, state_on_cpu
from tests.conftest import eval_settings, model_spec

SUMMARY = re.compile(r"^\[kdpipe\] (.+): ([\d,]+) rows in ([\d.]+) s \(([\d,]+) rows/s\), peak ([\d,]+) MB$")


def test_bar_into_a_file_writes_lines_with_rate_and_eta(monkeypatch):
    monkeypatch.setattr(progress, "FILE_INTERVAL", 0.0)
    log = io.StringIO()
    before = progress.rows_done()
    with progress.bar(300, "logits t/train", file=log) as bar:
        for _ in range(3):
            bar.update(100)
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) >= 3
    assert all(line.startswith("logits t/train:") and line == line.rstrip() for line in lines)
    assert "300/300" in lines[-1] and "rows/s" in lines[-1] and "<00:00" in lines[-1]  # rate and time left
    assert progress.rows_done() - before == 300


def test_hidden_bar_counts_rows_and_writes_nothing():
    log = io.StringIO()
    before = progress.rows_done()
    with progress.bar(50, None, file=log) as bar:
        bar.update(50)
    assert log.getvalue() == "" and progress.rows_done() - before == 50


def test_bar_into_a_file_is_throttled(monkeypatch):
    monkeypatch.setattr(progress, "FILE_INTERVAL", 3600.0)
    log = io.StringIO()
    with progress.bar(10_000, "mc t/train", file=log) as bar:
        for _ in range(10_000):
            bar.update(1)
    assert len(log.getvalue().splitlines()) <= 3  # the first line, at most one redraw, the last


def test_summary_line():
    line = progress.summary_line("logits minilm_a/train", 1_000_000, 412.0, 812.4)
    assert line == "[kdpipe] logits minilm_a/train: 1,000,000 rows in 412.0 s (2,427 rows/s), peak 812 MB"
    assert SUMMARY.match(line)
    assert progress.summary_line("prepare data", 0, 3.21, 300) == "[kdpipe] prepare data: done in 3.2 s, peak 300 MB"
    assert progress.peak_memory_mb() > 10


def test_job_names():
    logits = {"signal": "logits", "split": "train", "batch_size": 64}
    shard = {"teacher": Path("results/teachers/minilm_a"), "shard": "2-of-4", "out_part": Path("x")}
    assert job_name("signal-shard", logits, shard) == "logits minilm_a/train shard 2-of-4"
    assert job_name("signal-shard", logits, {**shard, "shard": "1-of-1"}) == "logits minilm_a/train"
    gather = {"parts": [Path("p")], "out": Path("results/signals/minilm_a/train")}
    assert job_name("signal-gather", logits, gather) == "logits gather minilm_a/train"
    evaluation = {"model": "vkd", "splits": ["validation", "test"]}
    assert job_name("evaluate", evaluation, {"out_json": [Path("x")]}) == "evaluate vkd/validation,test"
    assert job_name("evaluate-ensemble", {"model": "ens", "splits": ["test"]}, {}) == "evaluate-ensemble ens/test"
    forward = {"signals": [logits, {**logits, "signal": "pooled"}]}  # a pass that makes several signals
    whole = {"teacher": Path("results/teachers/minilm_a"), "out": Path("results/signals/minilm_a/train")}
    assert job_name("signal-pass", forward, whole) == "logits+pooled minilm_a/train"
    assert job_name("signal-shard", forward, shard) == "logits+pooled minilm_a/train shard 2-of-4"
    assert job_name("distill", {}, {"data": Path("d"), "out": Path("results/students/vkd")}) == "distill vkd"
    assert job_name("report", {}, {"out": Path("results/report")}) == "report"
    assert job_name("route-transfer", {}, {"route": Path("results/routes/muki")}) == "route-transfer muki"


def test_an_inference_pass_counts_its_rows():
    encoded = encode(load_tokenizer("builtin:tiny-bert"), ["one", "two words", "three more words"] * 7, max_length=8)
    before = progress.rows_done()
    assert sum(len(b["index"]) for b in iterate(encoded, 4, torch.device("cpu"))) == 21
    assert progress.rows_done() - before == 21


def test_every_job_prints_its_summary(tiny_data, tmp_path, capsys, monkeypatch):
    labels = read_labels(tiny_data)
    model, tokenizer = build_student(
        model_spec({"config": {"tokenizer": "builtin:tiny-bert", "hidden_size": 32, "num_layers": 1, "num_heads": 2}}),
        labels,
        seed=0,
    )
    manifest = {"kind": "student", "config": {"max_length": 16}, "labels": labels, "method": "vanilla_kd"}
    result = FitResult(best_state=state_on_cpu(model), best_metrics={"score": 0.0}, best_epoch=1)
    save_trained(tmp_path / "model", model, tokenizer, labels, result, manifest)
    splits = ["validation", "test"]  # one job, one summary line for both
    params = eval_settings(model="tiny", splits=splits, batch_size=4).to_dict()
    args = ["--model", str(tmp_path / "model"), "--data", str(tiny_data)]
    out = ["--out-json", *(str(tmp_path / f"{s}.json") for s in splits)]
    out += ["--out-predictions", *(str(tmp_path / f"{s}.parquet") for s in splits)]
    before = progress.rows_done()
    with progress.bar(7, None) as bar:  # (rows of an earlier pass in this process are not the job's)
        bar.update(7)
    capsys.readouterr()
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    assert main(["evaluate", "--params", json.dumps(params), *args, *out]) == 0
    lines = capsys.readouterr().err.strip().splitlines()
    match = SUMMARY.match(lines[-1])
    assert match, lines[-1]
    rows = sum(len(read_split(tiny_data, s)) for s in splits)
    assert match[1] == "evaluate tiny/validation,test" and int(match[2].replace(",", "")) == rows
    assert float(match[3]) >= 0 and int(match[5].replace(",", "")) > 0
    assert np.isfinite(float(match[4].replace(",", ""))) and progress.rows_done() - before == 7 + rows
    assert pyarrow.default_memory_pool().backend_name == "system"  # (Arrow allocates with malloc in a job)


def test_a_training_epoch_shows_and_counts_its_rows(capsys):
    texts = [f"{w} story number {i}" for i in range(10) for w in ("sport", "money")]
    data = encode(load_tokenizer("builtin:tiny-bert"), texts, max_length=16, labels=[i % 2 for i in range(20)])

    def loss(model, batch):
        return torch.nn.functional.cross_entropy(model(**model_inputs(batch)).logits, batch["labels"]), {}

    model = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=0)
    before = progress.rows_done()
    settings = TrainSettings(epochs=2, lr=1e-3, batch_size=8, seed=0, checkpoint_every=0)
    fit(model, train=data, loss_fn=loss, validate=None, settings=settings, device=torch.device("cpu"), desc="t")
    assert progress.rows_done() - before == 2 * 20
    err = capsys.readouterr().err
    assert "t epoch 2/2" in err and "20/20" in err and "rows/s" in err
