"""A training job that finished but was recorded as incomplete (Snakemake stopped by a signal to its own PID) is
not trained again: the rerun restores its output at once (kdpipe/core/finished.py, kdpipe/cli.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kdpipe.cli import main
from kdpipe.core.checksums import checksum
from kdpipe.core.fingerprint import fingerprint
from kdpipe.core.finished import NO_RESTORE, drop_finished_copies
from kdpipe.core.identity import job_identity
from kdpipe.core.store import KdpipeError
from tests.conftest import TINY_TEACHER, teacher_settings


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


def test_a_second_job_for_the_same_output_waits_for_the_first_and_never_takes_its_output(tiny_data, tmp_path):
    """An orphaned job of a killed Snakemake holds the lock and, when it ends, leaves an output made with other
    settings: the second job waits for it, naming it, then makes its own output instead of keeping that one."""
    out = tmp_path / "teachers" / "t"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_AND_WAIT, str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = subprocess.Popen(
            [sys.executable, "-m", "kdpipe", "finetune-teacher", "--params", json.dumps(TINY_TEACHER)]
            + ["--data", str(tiny_data), "--out", str(out)],
            stderr=subprocess.PIPE,
            text=True,
        )
        line = second.stderr.readline()
        while "another job" not in line and line:
            line = second.stderr.readline()
        assert f"{out}: another job is already making it (pid {holder.pid} on " in line and "waiting" in line
        assert second.poll() is None  # still waiting
        holder.communicate("finish\n", timeout=30)  # the orphan ends, leaving its output of other settings
        assert json.loads((out / "manifest.json").read_text())["config"] == {"epochs": 500}
        second.stderr.read()
        assert second.wait(timeout=120) == 0
    finally:
        holder.kill()
        holder.wait()
    assert json.loads((out / "manifest.json").read_text())["config"]["epochs"] == TINY_TEACHER["epochs"]


LOCK_AND_WAIT = """
import json, sys
from pathlib import Path
from kdpipe.core.finished import lock_outputs
out = Path(sys.argv[1])
lock_outputs([out])
print("locked", flush=True)
sys.stdin.readline()
out.mkdir(parents=True)
(out / "manifest.json").write_text(json.dumps({"config": {"epochs": 500}}))
"""


# ---- resume keyed on the job's identity (docs/caching-and-reruns.md, "One identity per job")


def interrupted(monkeypatch, params, data, out):
    """Run the teacher job until its last checkpoint is written, then stop it before its output is saved (as a
    kill between the last epoch and the save would)."""

    def stop(*args, **kwargs):
        raise KdpipeError("stopped before saving (test)")

    with monkeypatch.context() as m:
        m.setattr("kdpipe.stages.finetune_teacher.save_trained", stop)
        assert finetune(params, data, out) == 2
    assert not out.exists()
    resume = out.parent / ".resume" / out.name
    (checkpoint,) = resume.glob("ckpt-*")
    return checkpoint


def validation_records(out):
    return [r for r in map(json.loads, (out / "train_log.jsonl").read_text().splitlines()) if "validation" in r]


def test_an_interrupted_teacher_resumes_on_the_same_inputs(tiny_data, tmp_path, capfd, monkeypatch):
    out = tmp_path / "teachers" / "t"
    checkpoint = interrupted(monkeypatch, TINY_TEACHER, tiny_data, out)
    state = json.loads((checkpoint / "state.json").read_text())
    code = fingerprint("kdpipe.stages.finetune_teacher")  # (the rule passes its fingerprint; called directly: this)
    assert state["resume_key"] == job_identity(
        teacher_settings(), [tiny_data], code
    )  # the job's identity, not its slice
    assert state["epoch"] == 1
    capfd.readouterr()

    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    err = capfd.readouterr().err
    assert "resuming teacher at epoch 1 step 0" in err
    assert "teacher epoch 1" not in err and "discarded" not in err
    assert len(validation_records(out)) == 1
    assert not (out.parent / ".resume" / "t").exists()  # the checkpoints go when the job finishes


def test_an_interrupted_teacher_whose_data_changed_starts_again(tiny_data, tmp_path, capfd, monkeypatch):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    out = tmp_path / "teachers" / "t"
    interrupted(monkeypatch, TINY_TEACHER, data, out)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["duplicates_dropped"] += 1  # another dataset artifact at the same path: the same settings, same rows
    (data / "manifest.json").write_text(json.dumps(manifest))
    capfd.readouterr()

    assert finetune(TINY_TEACHER, data, out) == 0
    err = capfd.readouterr().err
    resume = out.parent / ".resume" / "t"
    assert f"[kdpipe] {resume}: a checkpoint made from other inputs; discarded, training starts from scratch" in err
    assert "resuming" not in err and "teacher epoch 1" in err
    assert [r["epoch"] for r in validation_records(out)] == [1]  # the log of the discarded attempt is not kept


@pytest.mark.parametrize(
    ("damage", "name"),
    [
        ("flip", "model.safetensors"),
        ("truncate", "optim.pt"),
        ("truncate", "state.json"),
        ("empty", "best.safetensors"),
    ],
)
def test_a_damaged_checkpoint_is_discarded_and_the_job_trains_from_scratch(
    damage, name, tiny_data, tmp_path, capfd, monkeypatch
):
    out = tmp_path / "teachers" / "t"
    target = interrupted(monkeypatch, TINY_TEACHER, tiny_data, out) / name
    size = target.stat().st_size
    with open(target, "r+b") as fh:
        if damage == "flip":
            fh.seek(size // 2)
            byte = fh.read(1)
            fh.seek(size // 2)
            fh.write(bytes([byte[0] ^ 0xFF]))
        else:
            fh.truncate(size // 2 if damage == "truncate" else 0)
    capfd.readouterr()

    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    err = capfd.readouterr().err
    resume = out.parent / ".resume" / "t"
    assert f"[kdpipe] {resume}: the checkpoint is damaged (" in err
    assert "discarded, training starts from scratch" in err
    if name != "state.json":
        assert name in err.split("the checkpoint is damaged")[1].splitlines()[0]  # it names the file
    assert "resuming" not in err and "teacher epoch 1" in err
    assert json.loads((out / "manifest.json").read_text())["checksums"]
    assert [r["epoch"] for r in validation_records(out)] == [1]


# ---- kept copies (docs/caching-and-reruns.md, "A finished job recorded as incomplete")


def test_a_restored_output_is_a_real_copy_of_the_kept_one(tiny_data, tmp_path, capfd):
    out = tmp_path / "teachers" / "t"
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    done = out.parent / ".resume" / "t.done"
    files = sorted(p.relative_to(done) for p in done.rglob("*") if p.is_file())
    assert Path("model.safetensors") in files and Path("manifest.json") in files
    for rel in files:  # the first output and its kept copy share no file
        assert (out / rel).stat().st_ino != (done / rel).stat().st_ino
        assert (out / rel).stat().st_nlink == 1 and (done / rel).stat().st_nlink == 1

    shutil.rmtree(out)
    capfd.readouterr()
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    assert "restored, already finished by this same job" in capfd.readouterr().err
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == files
    for rel in files:
        assert (out / rel).stat().st_ino != (done / rel).stat().st_ino
        assert (out / rel).stat().st_nlink == 1 and (done / rel).stat().st_nlink == 1
        assert (out / rel).read_bytes() == (done / rel).read_bytes()

    # damage to the output never reaches the kept copy
    weights = (done / "model.safetensors").read_bytes()
    with open(out / "model.safetensors", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\0" * 8)
    assert (done / "model.safetensors").read_bytes() == weights


def test_a_damaged_kept_copy_is_not_restored(tiny_data, tmp_path, capfd):
    out = tmp_path / "teachers" / "t"
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    done = out.parent / ".resume" / "t.done"
    shutil.rmtree(out)
    size = (done / "model.safetensors").stat().st_size
    with open(done / "model.safetensors", "r+b") as fh:
        fh.seek(size - 10)
        byte = fh.read(1)
        fh.seek(size - 10)
        fh.write(bytes([byte[0] ^ 0x01]))
    capfd.readouterr()

    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    err = capfd.readouterr().err
    assert f"[kdpipe] {done}: " in err and "model.safetensors" in err
    assert "removed, not used (the job runs again)" in err
    assert "restored, already" not in err and "teacher epoch 1" in err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["checksums"]["model.safetensors"] == checksum(out / "model.safetensors")
    # the job's new kept copy is intact
    assert (done / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_a_forced_run_trains_even_with_a_kept_copy(tiny_data, tmp_path, capfd, monkeypatch):
    out = tmp_path / "teachers" / "t"
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    shutil.rmtree(out)
    monkeypatch.setenv(NO_RESTORE, "1")
    capfd.readouterr()
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    err = capfd.readouterr().err
    assert "restored" not in err and "teacher epoch 1" in err
    monkeypatch.setenv(NO_RESTORE, "0")  # the control: only "1" forces
    shutil.rmtree(out)
    assert finetune(TINY_TEACHER, tiny_data, out) == 0
    assert "restored, already finished by this same job" in capfd.readouterr().err


def kept(root, name):
    done = root / ".resume" / f"{name}.done"
    done.mkdir(parents=True)
    (done / "model.safetensors").write_bytes(b"w")
    done.with_name(done.name + ".identity").write_text("id")
    return done


def test_drop_finished_copies_keeps_only_copies_of_existing_outputs_when_asked(tmp_path):
    teachers, students = tmp_path / "teachers", tmp_path / "students"
    present, missing, student = kept(teachers, "a"), kept(teachers, "b"), kept(students, "s")
    (teachers / "a").mkdir()  # a's output exists (perhaps recorded as incomplete); b's and s's were deleted
    (tmp_path / "elsewhere").mkdir()

    dropped = drop_finished_copies([teachers, students, tmp_path / "elsewhere"], keep_if_output_exists=True)
    assert sorted(dropped) == sorted([missing, student])
    assert present.is_dir() and present.with_name("a.done.identity").is_file()
    for gone in (missing, student):
        assert not gone.exists() and not gone.with_name(gone.name + ".identity").exists()

    missing = kept(teachers, "b")
    assert sorted(drop_finished_copies([teachers])) == sorted([present, missing])
    assert list((teachers / ".resume").iterdir()) == []
    assert (teachers / "a").is_dir()  # outputs are never touched
