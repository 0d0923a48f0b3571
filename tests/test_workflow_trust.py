"""End to end, the ways users and faults break reruns (docs/caching-and-reruns.md): a dataset file or a backbone
folder edited in place, ``--forcerun`` after a finished run, a damaged model file rebuilt by the command the error
prints, Snakemake killed while a teacher trains (its output restored, not retrained) or while a teacher trains on
data that then changes (not resumed), two working directories whose same-named data differ sharing a cache, and
two runs at once on one cache.

A small local CSV (so the data is a file the config names), teacher ``ta`` from the builtin tiny BERT, ``tb``
from a local RoBERTa folder, and one vanilla-KD student.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kdpipe.data.prepare import _read_bbc_news
from tests.test_workflow import copy_project, environment, finished_project, planned_jobs, snakemake
from tests.tiny_models import tiny_roberta

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/trust.yaml"
TEACHER_LOG = "results/logs/finetune_teacher/{}.log"


def write_project_files(project: Path, *, data_seed: int = 0) -> None:
    frame = _read_bbc_news()
    frame = frame.groupby("label").head(12).sample(frac=1, random_state=data_seed)
    (project / "data").mkdir(exist_ok=True)
    frame.to_csv(project / "data/train.csv", index=False)
    tiny_roberta(project / "models/roberta")
    config = yaml.safe_load((project / "tests/configs/tiny.yaml").read_text())
    config["dataset"] = {"name": "local", "source": "data/train.csv", "split": {"validation": 0.2, "test": 0.2}}
    config["teachers"] = {
        "ta": {"classes": {"slice": 0, "of": 2}, "epochs": 1},
        "tb": {"backbone": "models/roberta", "classes": {"slice": 1, "of": 2}, "epochs": 1},
    }
    config["students"] = {"s_vkd": {"method": "vanilla_kd", "lr": 1.0e-3}}
    config["mc_dropout"]["splits"] = []
    config["evaluate"] = {"splits": ["test"]}
    (project / CONFIG).write_text(yaml.safe_dump(config))


def with_config(project: Path, edit) -> str:
    config = yaml.safe_load((project / CONFIG).read_text())
    edit(config)
    (project / "tests/configs/edited.yaml").write_text(yaml.safe_dump(config))
    return "tests/configs/edited.yaml"


@pytest.fixture(scope="module")
def trusted(tmp_path_factory):
    return finished_project(tmp_path_factory, "trust", configfile=CONFIG, setup=write_project_files)


def run(project, env, *args, configfile=CONFIG, check=True):
    return snakemake(project, env, *args, configfile=configfile, check=check)


def test_a_dataset_file_edited_in_place_reruns_everything_and_its_old_bytes_nothing(trusted):
    project, env, _ = trusted
    data = project / "data/train.csv"
    original = data.read_bytes()
    cut = original.rindex(b" the ")
    data.write_bytes(original[:cut] + b" The " + original[cut + 5 :])  # same path and size, another text
    try:
        jobs = planned_jobs(project, env, CONFIG)
        assert {("prepare", ""), ("finetune_teacher", "teacher=ta"), ("finetune_teacher", "teacher=tb")} <= jobs
        assert "Params have changed" in run(project, env, "-n")
    finally:
        data.write_bytes(original)
    assert "Nothing to be done" in run(project, env, "-n")


def test_a_backbone_folder_replaced_in_place_reruns_only_its_teacher(trusted):
    project, env, base = trusted
    folder = project / "models/roberta"
    keep = base / "roberta.orig"
    shutil.copytree(folder, keep)
    try:
        shutil.rmtree(folder)
        tiny_roberta(folder, seed=3)
        jobs = planned_jobs(project, env, CONFIG)
        assert ("finetune_teacher", "teacher=tb") in jobs
        assert ("finetune_teacher", "teacher=ta") not in jobs and ("prepare", "") not in jobs
    finally:
        shutil.rmtree(folder)
        shutil.copytree(keep, folder)
    assert "Nothing to be done" in run(project, env, "-n")


def test_forcerun_trains_again_and_a_damaged_file_is_rebuilt_by_the_printed_command(trusted):
    project, env, _ = trusted
    weights = project / "results/teachers/ta/model.safetensors"
    before = weights.read_bytes()
    run(project, env, "--forcerun", "results/teachers/ta")
    log = (project / TEACHER_LOG.format("ta")).read_text()
    assert "teacher epoch 1:" in log and "restored" not in log

    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    failed = run(project, env, "--forcerun", "results/signals/ta/train/logits.json", check=False)
    assert failed.returncode != 0
    # the log of the pass that makes logits on train (a rule named after its signals, e.g. logits+pooled+hidden)
    logs = [p for p in (project / "results/logs").glob("*/ta.train*.log") if "logits" in p.parent.name.split("+")]
    message = "\n".join(path.read_text() for path in logs)
    command = re.search(r"rebuild it with: (snakemake --forcerun \S+)", message)
    assert command and "changed since kdpipe wrote it" in message, message[-2000:]
    run(project, env, *command.group(1).split()[1:])  # exactly what it says, plus the usual options
    assert "restored" not in (project / TEACHER_LOG.format("ta")).read_text()
    assert weights.read_bytes() != bytes(data) and len(weights.read_bytes()) == len(before)
    assert "Nothing to be done" in run(project, env, "-n")


def start(project, env, configfile):
    cmd = [str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/cpu", "--configfile", configfile]
    return subprocess.Popen(
        [*cmd, "--cores", "2"], cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def wait_for(condition, timeout=180.0, what="condition"):
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def log_says(path: Path, text: str):
    return lambda: path.is_file() and text in path.read_text(errors="replace")


def test_a_teacher_finished_after_snakemake_was_killed_is_restored_not_retrained(trusted):
    project, env, _ = trusted
    configfile = with_config(project, lambda c: c["teachers"]["ta"].update(epochs=150))
    log = project / TEACHER_LOG.format("ta")
    log.unlink()
    snake = start(project, env, configfile)
    wait_for(log_says(log, "teacher epoch 3:"), what="ta's third epoch")
    snake.send_signal(signal.SIGKILL)  # Snakemake alone: its teacher job runs on and finishes
    snake.wait()
    kept = project / "results/teachers/.resume/ta.done.identity"
    wait_for(kept.is_file, what="the orphaned job's kept copy")
    run(project, env, "--unlock", configfile=configfile)
    run(project, env, configfile=configfile)
    assert "restored, already finished by this same job" in log.read_text()
    assert not kept.exists(), "a run that ended keeps no copy"
    assert "Nothing to be done" in run(project, env, "-n", configfile=configfile)


def test_a_teacher_killed_before_its_data_changed_is_not_resumed(trusted):
    project, env, _ = trusted
    configfile = with_config(project, lambda c: c["teachers"]["ta"].update(epochs=150))
    log = project / TEACHER_LOG.format("ta")
    log.unlink(missing_ok=True)
    snake = subprocess.Popen(  # a process group of its own: SIGKILL to all of it, jobs included
        [str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/cpu", "--configfile", configfile]
        + ["--cores", "2", "--forcerun", "results/teachers/ta"],
        cwd=project,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_for(log_says(log, "teacher epoch 3:"), what="ta's third epoch")
    os.killpg(snake.pid, signal.SIGKILL)
    snake.wait()
    assert list((project / "results/teachers/.resume/ta").glob("ckpt-*")), "no checkpoint to resume from"
    reseeded = with_config(
        project, lambda c: c["dataset"]["split"].update(seed=7) or c["teachers"]["ta"].update(epochs=150)
    )
    run(project, env, "--unlock", configfile=reseeded)
    run(project, env, "results/teachers/ta", configfile=reseeded)
    text = log.read_text()
    assert "resuming" not in text and "made from other inputs; discarded" in text
    assert "teacher epoch 1:" in text


def test_same_named_data_of_other_content_never_shares_a_cache_entry(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    projects = []
    for name, data_seed in (("one", 0), ("two", 1), ("three", 0)):
        project = copy_project(tmp_path / name)
        write_project_files(project, data_seed=data_seed)
        env = environment(project, cache)
        run(project, env, "results/teachers/ta", "--cache")  # (--cache takes rule names: target first)
        projects.append((project, env))
    trained = [(p / TEACHER_LOG.format("ta")).stat().st_size > 0 for p, _ in projects]
    assert trained == [True, True, False]  # "two" has other rows under the same path: its own teacher
    weights = [p / "results/teachers/ta/model.safetensors" for p, _ in projects]
    assert os.path.realpath(weights[2]) == os.path.realpath(weights[0]) != os.path.realpath(weights[1])


def test_two_runs_at_once_on_one_cache_train_a_teacher_once(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    projects = []
    for name in ("one", "two"):
        project = copy_project(tmp_path / name)
        write_project_files(project)
        configfile = with_config(project, lambda c: c["teachers"]["ta"].update(epochs=60))
        projects.append((project, environment(project, cache), configfile))
    cmd = [str(Path(sys.executable).parent / "snakemake"), "--profile", "profiles/cpu", "--cores", "2"]
    runs = [
        subprocess.Popen(
            [*cmd, "results/teachers/ta", "--configfile", configfile, "--cache"],  # (both take several values)
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for project, env, configfile in projects
    ]
    outputs = [r.communicate(timeout=600)[0] for r in runs]
    assert [r.returncode for r in runs] == [0, 0], "\n".join(out[-3000:] for out in outputs)
    logs = [(p / TEACHER_LOG.format("ta")).read_text() for p, _, _ in projects]
    assert sum("teacher epoch 60:" in log for log in logs) == 1, logs
    # the other run waited, stopped when the teacher was stored, and its retry linked the entry
    assert sum("Symlinking output file results/teachers/ta from cache" in out for out in outputs) == 1, outputs
    entries = [entry for entry in cache.iterdir() if entry.is_dir() and not entry.name.startswith(".")]
    assert len(entries) == 1 and not [p for p in entries[0].iterdir() if p.is_dir()], "a nested copy in the entry"
    weights = [os.path.realpath(p / "results/teachers/ta/model.safetensors") for p, _, _ in projects]
    assert weights[0] == weights[1] and Path(weights[0]).is_relative_to(cache)
