"""A teacher job killed with SIGKILL mid-training leaves no finished-looking output; the rerun resumes."""

import json
import signal
import subprocess
import sys
import time

import pytest

from kdpipe.training.loop import read_resume_state
from tests.conftest import TINY_TEACHER

pytestmark = pytest.mark.slow


def test_sigkill_during_teacher_training_then_resume(tiny_data, tmp_path):
    out = tmp_path / "teachers" / "t"
    params = json.dumps({**TINY_TEACHER, "epochs": 40, "batch_size": 4, "checkpoint_every": 2})
    cmd = [
        sys.executable,
        "-m",
        "kdpipe",
        "finetune-teacher",
        "--params",
        params,
        "--data",
        str(tiny_data),
        "--out",
        str(out),
    ]
    resume = tmp_path / "teachers" / ".resume" / "t"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not ((read_resume_state(resume) or {}).get("epoch", 0) >= 1):
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = read_resume_state(resume)
    assert killed_at, "no checkpoint was written before the kill"
    assert not out.exists(), "a killed job left a finished-looking output"

    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"resuming teacher at epoch {killed_at['epoch']} step {killed_at['step_in_epoch']}" in result.stderr
    assert (out / "model.safetensors").exists() and not resume.exists()
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log if "validation" in r] == list(range(1, 41))
