"""A training job that finished but was recorded as incomplete (Snakemake stopped by a signal to its own PID) is
not trained again: the rerun restores its output at once (kdpipe/core/finished.py, kdpipe/cli.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

from kdpipe.cli import main
from tests.conftest import TINY_TEACHER


def finetune(params, data, out):
    return main(["finetune-teacher", "--params", json.dumps(params), "--data", str(data), "--out", str(out)])


def test_a_finished_job_whose_output_was_deleted_is_restored_not_retrained(tiny_data, tmp_path, capfd):
    out = tmp_path / "teachers" / "t"
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    weights = (out / "model.safetensors").read_bytes()
    capfd.readouterr()

    shutil.rmtree(out)  # what `snakemake --rerun-incomplete` does to an output it saw as incomplete
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    err = capfd.readouterr().err
    assert "restored, already finished by this same job" in err and "teacher epoch" not in err
    assert (out / "model.safetensors").read_bytes() == weights
    assert (out / "train_log.jsonl").is_file() and json.loads((out / "manifest.json").read_text())["checksums"]

    # other settings: the kept copy is stale, the job trains
    shutil.rmtree(out)
    assert finetune({**TINY_TEACHER, "lr": 2e-3}, tiny_data, out) == 0
    err = capfd.readouterr().err
    assert "restored" not in err and "teacher epoch 1" in err


def test_other_input_data_is_not_restored(tiny_data, tmp_path, capfd):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    out = tmp_path / "teachers" / "t"
    assert finetune(TINY_TEACHER, data, out) == 0
    shutil.rmtree(out)
    labels = json.loads((data / "labels.json").read_text())
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["duplicates_dropped"] += 1  # another dataset artifact (same rows, other manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert labels and finetune(TINY_TEACHER, data, out) == 0
    assert "restored" not in capfd.readouterr().err


def test_a_second_job_for_the_same_output_stops_at_once(tiny_data, tmp_path):
    """The lock is held by another process (an orphaned job still training): the second job names it and leaves."""
    out = tmp_path / "teachers" / "t"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_AND_WAIT, str(out)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = subprocess.run(
            [sys.executable, "-m", "kdpipe", "finetune-teacher", "--params", json.dumps(TINY_TEACHER)]
            + ["--data", str(tiny_data), "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2
        assert f"{out}: another job is already making it (pid {holder.pid} on " in r.stderr
        assert not out.exists()
    finally:
        holder.kill()
        holder.wait()
    assert finetune(TINY_TEACHER, tiny_data, out) == 0  # the lock went with its process


LOCK_AND_WAIT = """
import sys, time
from pathlib import Path
from kdpipe.core.finished import lock_outputs
lock_outputs([Path(sys.argv[1])])
print("locked", flush=True)
time.sleep(600)
"""
