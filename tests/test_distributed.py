"""One training job on several processes (gloo on the CPU): the same model as one process on the same global batch,
one writer, and a resume after SIGKILL (docs/cluster.md, "One job on several devices")."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.torch import load_file
from transformers import BertConfig, BertModel

from kdpipe.data.dataset import read_split
from kdpipe.models.loading import TINY_BERT, load_tokenizer
from kdpipe.training import distributed
from tests.conftest import TINY_TEACHER
from tests.test_training import read_resume_state

# Weights of a 2-process and a 1-process run after the same steps: only the order of float sums differs
TOLERANCE = 1e-5


def test_a_global_batch_is_dealt_round_robin(monkeypatch):
    batch = np.array([10, 11, 12, 13, 14])
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(distributed, "rank", lambda: 0)
    rows, share = distributed.shard(batch)
    assert rows.tolist() == [10, 12, 14] and share == pytest.approx(0.6)
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    rows, share = distributed.shard(batch)
    assert rows.tolist() == [11, 13] and share == pytest.approx(0.4)
    # a last batch smaller than the process count: the process without a row runs one with no weight
    rows, share = distributed.shard(np.array([7]))
    assert rows.tolist() == [7] and share == 0.0


@pytest.fixture(scope="module")
def dropout_free(tmp_path_factory):
    """A tiny BERT folder without dropout, so that one and two processes make the same random numbers' worth of
    nothing and their weights can be compared."""
    folder = tmp_path_factory.mktemp("backbone") / "tiny-bert-no-dropout"
    config = BertConfig(**TINY_BERT, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    BertModel(config).save_pretrained(folder)
    load_tokenizer("builtin:tiny-bert").save_pretrained(folder)
    return folder


def teacher_cmd(data, out, params, *launch):
    return [sys.executable, "-m", "kdpipe", *launch, "finetune-teacher", "--params", json.dumps(params)] + [
        "--data",
        str(data),
        "--out",
        str(out),
    ]


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_two_processes_train_the_model_one_process_trains(tiny_data, dropout_free, tmp_path):
    rows = len(read_split(tiny_data, "train"))
    # batches of rows - 1: each epoch one uneven global batch (split 12/11 or so) and one of a single row, which
    # leaves the second process without a row of its own
    params = {**TINY_TEACHER, "backbone": str(dropout_free), "epochs": 2, "batch_size": rows - 1}
    one, two = tmp_path / "one" / "t", tmp_path / "two" / "t"
    run(teacher_cmd(tiny_data, one, params, "--threads", "1"))
    result = run(teacher_cmd(tiny_data, two, params, "--threads", "2", "--processes", "2"))

    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"largest weight difference, 2 processes against 1: {worst:.2e}")
    assert worst < TOLERANCE, f"weights differ by {worst}"
    log_one = [json.loads(line) for line in (one / "train_log.jsonl").read_text().splitlines()]
    log_two = [json.loads(line) for line in (two / "train_log.jsonl").read_text().splitlines()]
    assert [r.get("step") for r in log_one] == [r.get("step") for r in log_two], "one writer, same steps"
    for r1, r2 in zip(log_one, log_two):
        if "loss" in r1:  # the global batch's mean loss, gathered from both processes
            assert r2["loss"] == pytest.approx(r1["loss"], abs=1e-5) and r2["lr"] == pytest.approx(r1["lr"])
    m1, m2 = (json.loads((d / "metrics.json").read_text()) for d in (one, two))
    assert m1["best_epoch"] == m2["best_epoch"] and m2["validation"]["nll"] == pytest.approx(m1["validation"]["nll"])
    assert result.stderr.count("validation {") == 2, "one process reports (one line per epoch)"


@pytest.mark.slow
def test_a_killed_two_process_job_leaves_no_rank_behind_and_resumes(tiny_data, tmp_path):
    out = tmp_path / "teachers" / "t"
    params = {**TINY_TEACHER, "epochs": 20, "batch_size": 4, "checkpoint_every": 2}
    cmd = teacher_cmd(tiny_data, out, params, "--threads", "2", "--processes", "2")
    resume = tmp_path / "teachers" / ".resume" / "t"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 180
    while time.time() < deadline and not ((read_resume_state(resume) or {}).get("epoch", 0) >= 1):
        time.sleep(0.2)
    second = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = second.stderr.readline()
    while line and "another job is already making it" not in line:
        line = second.stderr.readline()
    assert "another job is already making it" in line and "waiting for it to end" in line  # torchrun holds the lock
    second.kill()
    second.wait()

    assert proc.poll() is None, "the job ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)  # the launcher (torchrun by now), not its ranks
    proc.wait()
    deadline = time.time() + 30
    while time.time() < deadline and _group_alive(proc.pid):
        time.sleep(0.2)
    assert not _group_alive(proc.pid), "a rank outlived its killed launcher"
    killed_at = read_resume_state(resume)
    assert killed_at and not out.exists()

    result = run(cmd)
    assert result.stderr.count("resuming teacher at epoch") == 1, result.stderr[-3000:]
    assert (out / "model.safetensors").exists() and not resume.exists()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    # each epoch once, also one killed between its log line and its checkpoint
    assert [r["epoch"] for r in log if "validation" in r] == list(range(1, 21))


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_launcher_passes_the_command_on_to_torchrun_without_its_own_options(monkeypatch):
    """``--processes 2`` becomes ``torchrun`` running the same command, with each rank's share of the threads."""
    from kdpipe import cli

    monkeypatch.setattr("kdpipe.core.finished.held_locks", lambda: [])
    monkeypatch.setattr(os, "environ", dict(os.environ))
    execs = []
    monkeypatch.setattr(os, "execv", lambda path, command: execs.append(command))
    argv = ["--threads", "8", "--log=x.log", "--processes", "2", "finetune-teacher", "--params", "{}", "--out", "o"]
    cli._launch(2, 8, "finetune-teacher", argv)
    (command,) = execs
    assert command[command.index("kdpipe") :] == ["kdpipe", "--threads", "4", *argv[5:]]
    assert "--nproc-per-node=2" in command and os.environ["OMP_NUM_THREADS"] == "4"
