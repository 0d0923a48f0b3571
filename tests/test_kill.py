"""A teacher job killed with SIGKILL mid-training leaves no finished-looking output; the rerun resumes, unless the
teacher's own code changed meanwhile."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_DATASET, TINY_TEACHER
from tests.test_training import read_resume_state

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


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(mask >> (sig - 1) & 1)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_job_killed_by_a_signal_says_so_in_its_log(tmp_path, sig):
    """A job stopped by a signal writes a last line that says so, then ends as the signal ends a process: SIGINT
    unwinds the job as a KeyboardInterrupt, then ends it quietly (no traceback)."""
    code = (
        "import sys, time\nimport kdpipe.data.prepare as stage\n"
        "stage.prepare = lambda params, **paths: time.sleep(60)  # a job that takes a while\n"
        "from kdpipe.cli import main\nsys.argv[1:] = ['prepare', '--params', sys.argv[2], '--out', sys.argv[1]]\n"
        "sys.exit(main())"
    )
    env = dict(os.environ)
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "data"), json.dumps(TINY_DATASET)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.time() + 60
    while not _catches(proc.pid, signal.SIGTERM):  # (Python catches SIGINT from the start: wait for ours)
        assert proc.poll() is None and time.time() < deadline, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(sig)
    status = proc.wait(timeout=120)  # (a loaded machine: two test files and their jobs at a time)
    err = proc.stderr.read()
    assert f"[kdpipe] prepare data: killed by {sig.name} (signal {int(sig)}); its outputs were not finished" in err
    assert status == -sig and not (tmp_path / "data").exists()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and err.rstrip().endswith("not finished"), err


def test_a_killed_teacher_resumes_after_an_edit_outside_its_code_and_starts_over_after_an_edit_of_its_loss(
    tiny_data, tmp_path
):
    """Resume checkpoints are keyed on the stage's code fingerprint (docs/caching-and-reruns.md,
    "One identity per job"): an edit to a report module, outside the teacher's import closure, keeps a killed
    teacher's checkpoint; an edit to its training loop (kdpipe/training/loop.py) discards it, and the log says why."""
    project = tmp_path / "project"
    shutil.copytree(REPO / "kdpipe", project / "kdpipe", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "teachers" / "t"
    resume = out.parent / ".resume" / "t"
    params = json.dumps({**TINY_TEACHER, "epochs": 40, "batch_size": 4, "checkpoint_every": 2})
    cmd = [sys.executable, "-m", "kdpipe", "finetune-teacher", "--params", params]
    cmd += ["--data", str(tiny_data), "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(project)}

    def killed_after_a_checkpoint(after_epoch: int) -> tuple[dict, str]:
        proc = subprocess.Popen(cmd, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 120
        while time.time() < deadline and (read_resume_state(resume) or {}).get("epoch", 0) <= after_epoch:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        said = proc.communicate()[1].decode()
        state = read_resume_state(resume)
        assert state and not out.exists()
        return state, said

    def append(module: str, text: str) -> None:
        path = project / "kdpipe" / module
        path.write_text(path.read_text() + text)

    first, _ = killed_after_a_checkpoint(0)
    append("report/html.py", "\n# an edit outside the teacher's code\n")
    second, said = killed_after_a_checkpoint(first["epoch"])
    assert f"resuming teacher at epoch {first['epoch']} step {first['step_in_epoch']}" in said
    assert "discarded" not in said

    append("training/loop.py", "\nLOOP_EDITED = True  # an edit of the teacher's training loop\n")
    result = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"[kdpipe] {resume}: a checkpoint made from other code; discarded, training starts from scratch" in (
        result.stderr
    )
    assert "resuming" not in result.stderr and "teacher epoch 1:" in result.stderr
    assert second["epoch"] > first["epoch"] >= 1
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log if "validation" in r] == list(range(1, 41))  # one run from scratch
