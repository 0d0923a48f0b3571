"""The lock-file GPU pool (kdpipe/core/gpus.py), on CPU: KDPIPE_GPUS fakes the GPU count, a tmp folder holds the
locks."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kdpipe.core.gpus import claim_gpu

# claims a GPU, prints its index and CUDA_VISIBLE_DEVICES, then holds it until its stdin closes
HOLDER = """
import os, sys
from kdpipe.core.gpus import claim_gpu
print(claim_gpu(), os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """Two fake GPUs, a fresh lock folder, no GPU chosen yet."""
    monkeypatch.setenv("KDPIPE_GPUS", "2")
    monkeypatch.setenv("KDPIPE_GPU_LOCKS", str(tmp_path / "locks"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("KDPIPE_DEVICE", raising=False)
    return tmp_path / "locks"


@pytest.fixture
def holders():
    """Start holder processes; each returns its claimed index. All are killed at the end of the test."""
    procs: list[subprocess.Popen] = []

    def start() -> tuple[subprocess.Popen, str]:
        p = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        index, visible = p.stdout.readline().split()
        assert index == visible
        return p, index

    yield start
    for p in procs:
        p.kill()
        p.wait()
        p.stdin.close()
        p.stdout.close()


def claim(wait_s: float, *cmd: str) -> subprocess.CompletedProcess:
    """Run a claim (or a kdpipe command) in a fresh process that waits at most ``wait_s`` for a GPU."""
    cmd = cmd or ("-c", "from kdpipe.core.gpus import claim_gpu; print(claim_gpu())")
    return subprocess.run(
        [sys.executable, *cmd],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "KDPIPE_GPU_WAIT_S": str(wait_s)},
    )


def test_concurrent_jobs_get_different_gpus_and_a_third_fails_clearly(pool, holders):
    (_, first), (_, second) = holders(), holders()
    assert {first, second} == {"0", "1"}
    r = claim(0.3)
    assert r.returncode != 0
    assert "all 2 GPUs are taken" in r.stderr and "waiting up to 0.3 s" in r.stderr
    assert "KdpipeError: no free GPU after 0.3 s: all 2 GPUs are held by other kdpipe jobs" in r.stderr
    assert "--resources gpu=N, N at most 2" in r.stderr
    assert sorted(f.name for f in pool.iterdir()) == ["gpu0.lock", "gpu1.lock"]


@pytest.mark.parametrize("how", ["exit", "sigkill"])
def test_a_freed_gpu_is_claimed_again(pool, holders, how):
    (p0, first), _ = holders(), holders()
    if how == "exit":
        p0.stdin.close()
    else:
        p0.kill()
    p0.wait()
    assert claim(5).stdout.split() == [first]


def test_a_waiting_job_gets_the_gpu_that_frees_up(pool, holders):
    (p0, first), _ = holders(), holders()
    waiter = subprocess.Popen(
        [sys.executable, "-c", "from kdpipe.core.gpus import claim_gpu; print(claim_gpu())"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "KDPIPE_GPU_WAIT_S": "20"},
    )
    assert "waiting up to 20 s" in waiter.stderr.readline()
    p0.stdin.close()
    out, _ = waiter.communicate(timeout=20)
    assert waiter.returncode == 0 and out.split() == [first]


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "3"},
        {"CUDA_VISIBLE_DEVICES": ""},
        {"KDPIPE_DEVICE": "cpu"},
        {"KDPIPE_DEVICE": "cuda:1"},
        {"KDPIPE_GPUS": "1"},
        {"KDPIPE_GPUS": "0"},
    ],
)
def test_nothing_to_choose_takes_no_lock(pool, monkeypatch, env):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    assert claim_gpu() is None
    assert os.environ.get("CUDA_VISIBLE_DEVICES") == before
    assert not pool.exists()


def test_the_cli_claims_before_a_model_stage_and_not_for_the_others(pool, holders, tmp_path):
    holders(), holders()
    r = claim(
        0,
        "-m",
        "kdpipe",
        "--threads",
        "1",
        "prototypes",
        "--params",
        '{"backbone": "builtin:tiny-bert", "by": "domain", "max_length": 16, "batch_size": 8}',
        "--data",
        "x",
        "--out",
        str(tmp_path / "out"),
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "kdpipe prototypes: error: no free GPU after 0 s" in r.stderr
    r = claim(0, "-m", "kdpipe", "report", "--evals", str(tmp_path / "missing.json"), "--out", str(tmp_path / "r"))
    assert r.returncode == 2 and "no free GPU" not in r.stderr and "missing.json: missing" in r.stderr


def test_the_cli_imports_no_torch_before_the_claim():
    r = subprocess.run(
        [sys.executable, "-c", "import sys, kdpipe.cli; print('torch' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert r.stdout.strip() == "False"
