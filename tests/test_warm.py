"""Warm start (docs/design.md, "Warm start"): a job forked from the server is the job a fresh process would be, a
signal to the job's process reaches its copy, and the server refuses whenever a copy could differ."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kdpipe.core import warm
from kdpipe.training.loop import read_resume_state
from tests.conftest import REPO, TINY_TEACHER

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not warm.available(), reason="warm start is off here (an NVIDIA device, or KDPIPE_WARM=0)"),
]


class Server:
    """A warm server over a copy of the package (so that a test may edit it), started by this process."""

    def __init__(self, root: Path):
        self.root = root
        self.socket = str(Path(os.environ.get("TMPDIR", "/tmp")) / f"kdpipe-warm-test-{os.getpid()}-{id(self)}")
        self.env = {**os.environ, "PYTHONPATH": str(root)}
        self.env.pop(warm.SOCKET_ENV, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kdpipe.core.warm", self.socket, str(os.getpid())], cwd=root, env=self.env
        )
        deadline = time.time() + 120
        while not os.path.exists(self.socket):
            assert self.proc.poll() is None and time.time() < deadline, "the server did not start"
            time.sleep(0.1)

    def run(self, *args, warm_start=True, env=None, **kwargs) -> subprocess.CompletedProcess:
        env = {**self.env, **(env or {}), **({warm.SOCKET_ENV: self.socket} if warm_start else {})}
        return subprocess.run(
            [sys.executable, "-m", "kdpipe", *args], cwd=self.root, env=env, capture_output=True, text=True, **kwargs
        )

    def popen(self, *args, **kwargs) -> subprocess.Popen:
        env = {**self.env, warm.SOCKET_ENV: self.socket}
        return subprocess.Popen(
            [sys.executable, "-m", "kdpipe", *args], cwd=self.root, env=env, stderr=subprocess.PIPE, **kwargs
        )

    def copy_of(self, resume: Path) -> int:
        """The copy running a training job, once it has written a checkpoint."""
        deadline = time.time() + 120
        while time.time() < deadline and not ((read_resume_state(resume) or {}).get("epoch", 0) >= 1):
            time.sleep(0.2)
        (copy,) = self.copies()
        return copy

    def copies(self) -> list[int]:
        """The server's children: the jobs' copies running now."""
        text = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text()
        return [int(pid) for pid in text.split()]

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=30)


def project_copy(root: Path) -> Path:
    shutil.copytree(REPO / "kdpipe", root / "kdpipe", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    server = Server(project_copy(tmp_path_factory.mktemp("warm")))
    yield server
    server.stop()


def teacher_args(data: Path, out: Path, **params) -> list[str]:
    params = json.dumps({**TINY_TEACHER, **params})
    return ["finetune-teacher", "--params", params, "--data", str(data), "--out", str(out)]


def test_a_warm_job_is_the_job_a_fresh_process_runs(server, tiny_data, tmp_path):
    for args in (["--help"], ["no-such-stage"], ["report", "--params", "{not json"]):
        warm_run, fresh = server.run(*args), server.run(*args, warm_start=False)
        assert (warm_run.returncode, warm_run.stdout, warm_run.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    outs = {}
    for mode in ("warm", "fresh"):
        outs[mode] = tmp_path / mode
        done = server.run(*teacher_args(tiny_data, outs[mode], epochs=1), warm_start=mode == "warm")
        assert done.returncode == 0 and "warm start" not in done.stderr, done.stderr
        assert "Writing model shards" not in done.stderr  # the libraries' bars stay out of a log, warm or not
    for name in ("model.safetensors", "config.json"):
        assert (outs["warm"] / name).read_bytes() == (outs["fresh"] / name).read_bytes()
    assert server.proc.poll() is None and server.copies() == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_job_reaches_its_copy_and_the_rerun_resumes(server, tiny_data, tmp_path, sig):
    out, resume = tmp_path / "teachers" / "t", tmp_path / "teachers" / ".resume" / "t"
    # killed in its first epochs (copy_of); the rerun trains the rest
    args = teacher_args(tiny_data, out, epochs=20, batch_size=4, checkpoint_every=2)
    job = server.popen(*args)
    copy = server.copy_of(resume)
    job.send_signal(sig)
    assert job.wait(timeout=30) == -sig  # the job's process ends as a fresh one would
    if sig != signal.SIGKILL:  # its copy says so in the log (a SIGKILL'd job's process can say nothing), and ends
        said = job.stderr.read().decode()  # (after Ctrl-C, without a KeyboardInterrupt traceback)
        assert f"t: killed by {sig.name} (signal {int(sig)}); its outputs were not finished" in said
        assert "Traceback" not in said and said.rstrip().endswith("not finished"), said[-3000:]
    deadline = time.time() + 10
    while copy in server.copies() and time.time() < deadline:
        time.sleep(0.05)
    assert copy not in server.copies(), "the copy outlived its job"
    killed_at = read_resume_state(resume)
    assert killed_at and not out.exists(), "a killed job left a finished-looking output"
    done = server.run(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"resuming teacher at epoch {killed_at['epoch']} step {killed_at['step_in_epoch']}" in done.stderr


def test_a_copy_killed_by_sigkill_is_named_in_the_jobs_log(server, tiny_data, tmp_path):
    """The kernel's out-of-memory killer kills the copy, which can say nothing: the job's process says it."""
    resume = tmp_path / "teachers" / ".resume" / "t"
    job = server.popen(
        *teacher_args(tiny_data, tmp_path / "teachers" / "t", epochs=20, batch_size=4, checkpoint_every=2)
    )
    copy = server.copy_of(resume)
    os.kill(copy, signal.SIGKILL)
    status, said = job.wait(timeout=30), job.stderr.read().decode()
    line = f"[kdpipe] finetune-teacher t (warm copy {copy}): killed by SIGKILL (signal 9) (out of memory?"
    assert status == -signal.SIGKILL and line in said, said[-3000:]


def test_a_signal_the_job_ignores_its_copy_ignores(server, tiny_data, tmp_path):
    """As under nohup: a fresh job would run on after SIGHUP, and so does a warm one."""
    resume = tmp_path / "teachers" / ".resume" / "t"
    args = teacher_args(tiny_data, tmp_path / "teachers" / "t", epochs=40, batch_size=4, checkpoint_every=2)
    job = server.popen(*args, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    copy = server.copy_of(resume)
    job.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert job.poll() is None and copy in server.copies()
    job.kill()
    job.wait(timeout=30)


def test_a_job_whose_server_dies_fails_and_its_copy_finishes_nothing(tiny_data, tmp_path):
    server = Server(project_copy(tmp_path / "project"))
    out, resume = tmp_path / "teachers" / "t", tmp_path / "teachers" / ".resume" / "t"
    job = server.popen(*teacher_args(tiny_data, out, epochs=40, batch_size=4, checkpoint_every=2))
    copy = server.copy_of(resume)
    server.proc.kill()
    server.proc.wait()
    Path(server.socket).unlink()  # (a killed server leaves its socket)
    assert job.wait(timeout=30) == 1
    assert "the server stopped while the job ran" in job.stderr.read().decode()
    assert not Path(f"/proc/{copy}").exists() or Path(f"/proc/{copy}/stat").read_text().split(")")[-1].split()[0] == "Z"
    time.sleep(1.0)
    assert not out.exists(), "the copy finished the job after it was reported failed"


def test_a_job_that_says_nothing_holds_up_no_other(server):
    import socket

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(server.socket)
    try:
        done = server.run("--help", timeout=30)
        assert done.returncode == 0 and "usage: kdpipe" in done.stdout
    finally:
        silent.close()


def test_another_environment_or_edited_code_starts_afresh(tmp_path):
    server = Server(project_copy(tmp_path))
    try:
        other = server.run("--help", env={"KDPIPE_SOMETHING": "1"})
        assert other.returncode == 0 and "usage: kdpipe" in other.stdout
        assert "warm start: another environment (KDPIPE_SOMETHING); starting afresh" in other.stderr
        per_job = server.run("--help", env={"OMP_NUM_THREADS": "7", "TMPDIR": str(tmp_path)})
        assert per_job.returncode == 0 and per_job.stderr == ""  # Snakemake sets these for each job
        with open(tmp_path / "kdpipe" / "core" / "store.py", "a") as fh:
            fh.write("\n# an edit\n")
        edited = server.run("--help")
        assert edited.returncode == 0 and "warm start: kdpipe's code changed since the server started" in edited.stderr
    finally:
        server.stop()
    assert not os.path.exists(server.socket)


def test_the_server_ends_with_the_process_that_started_it(tmp_path):
    code = (
        "import json, sys; from kdpipe.core import warm; "
        "print(json.dumps(warm.start()))"  # the starting process exits at once
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout)
    deadline = time.time() + 120
    while time.time() < deadline and Path(f"/proc/{started['pid']}").exists():
        time.sleep(0.2)
    stat = Path(f"/proc/{started['pid']}/stat")
    assert not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z", "an orphaned server kept running"
    assert not os.path.exists(started["socket"])


def test_multi_process_jobs_are_not_forked():
    assert warm._processes(["--processes", "2", "finetune-teacher"]) == 2
    assert warm._processes(["--processes=3", "distill"]) == 3
    assert warm._processes(["--threads", "2", "distill"]) == 1


def test_a_copy_takes_the_jobs_blas_threads():
    """numpy's BLAS read its thread count when the server imported it: the copy gets the job's, as a fresh one."""
    code = (
        "import os, numpy, threadpoolctl; from kdpipe.core import warm; "
        "os.environ['OPENBLAS_NUM_THREADS'] = '1'; warm._blas_threads(); "
        "print(sorted({d['num_threads'] for d in threadpoolctl.threadpool_info() if d['user_api'] == 'blas'}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "[1]", done.stdout + done.stderr
