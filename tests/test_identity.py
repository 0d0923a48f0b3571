"""One identity per job (docs/caching-and-reruns.md, "Rerun rules", "One identity per job"): local files and
folders by content, the plan's slices carrying those digests, and the job identity over params, inputs and the
stage's code fingerprint (with the library versions), saying which of them changed."""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from kdpipe.core import fingerprint, identity
from kdpipe.core.checksums import write_manifest
from kdpipe.core.identity import content_digest, job_identity, what_changed
from kdpipe.core.identity import local_content as digests
from kdpipe.core.settings import Settings
from kdpipe.plan.slices import named_paths


def local_content(config_slice: dict) -> dict:
    """The digests the plan adds to a slice: those of the local paths it names (kdpipe.plan.slices)."""
    return digests(named_paths(config_slice))


MEMO = Path(".snakemake") / "kdpipe-content.json"


def write_big(path: Path, fill: bytes = b"a", size: int = 2 << 20) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fill * size)
    return path


def edit_in_place(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


# ---- content_digest / local_content


def test_a_large_file_edited_in_place_gets_a_new_digest_even_with_its_mtime_set_back(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(identity, "_RACY_NS", -(10**12))  # (this file is seconds old: remember it all the same)
    data = write_big(tmp_path / "data" / "train.bin")  # over 1 MB: its digest is remembered
    before = content_digest(data)
    memo = json.loads(MEMO.read_text())
    assert str(data.resolve()) in memo  # the memo is used for this file

    # the memo answers a no-op rerun without reading the file
    real_checksum = identity.checksum
    monkeypatch.setattr(identity, "checksum", lambda path: pytest.fail(f"{path} read again"))
    assert content_digest(data) == before
    monkeypatch.setattr(identity, "checksum", real_checksum)

    stat = data.stat()
    edit_in_place(data, 1000, b"b")  # same size, same inode
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the old modification time
    assert data.stat().st_size == stat.st_size and data.stat().st_mtime_ns == stat.st_mtime_ns
    after = content_digest(data)
    assert after != before
    MEMO.unlink()
    assert content_digest(data) == after  # what a fresh read gives
    assert local_content({"source": "data/train.bin"}) == {"source": after}


def test_a_file_written_seconds_ago_is_not_remembered(tmp_path, monkeypatch):
    """A coarse file-system clock could give an edit in the same tick the same times: such files are read again."""
    monkeypatch.chdir(tmp_path)
    data = write_big(tmp_path / "train.bin")
    content_digest(data)
    assert not MEMO.exists() or str(data.resolve()) not in json.loads(MEMO.read_text())


def test_a_small_file_edited_in_place_gets_a_new_digest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "train.csv"
    data.write_text("text,label\nhello,a\n")
    before = content_digest(data)
    stat = data.stat()
    data.write_text("text,label\nhellp,a\n")
    os.utime(data, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert content_digest(data) != before
    assert before.startswith("xxh3_128:")


def test_a_folder_digest_changes_when_a_file_is_replaced_added_or_renamed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = tmp_path / "models" / "m"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "bert"}')
    write_big(model / "sub" / "model.safetensors")  # memoised
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    first = content_digest(model)
    assert content_digest(model) == first  # deterministic

    replacement = write_big(tmp_path / "other.bin", fill=b"c")
    os.replace(replacement, model / "sub" / "model.safetensors")
    replaced = content_digest(model)
    assert replaced != first

    write_big(tmp_path / "again.bin")  # the original bytes back: the original digest
    os.replace(tmp_path / "again.bin", model / "sub" / "model.safetensors")
    assert content_digest(model) == first

    (model / "extra.txt").write_text("x")
    added = content_digest(model)
    assert added not in (first, replaced)

    (model / "extra.txt").rename(model / "extra2.txt")  # same bytes, another name
    assert content_digest(model) not in (first, replaced, added)


def test_builtins_hub_names_and_artifacts_carry_no_local_content(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results" / "teachers" / "t").mkdir(parents=True)
    (tmp_path / "results" / "teachers" / "t" / "config.json").write_text("{}")
    (tmp_path / "data.csv").write_text("text,label\n")
    config = {
        "source": "builtin:bbc_news",
        "backbone": "hf:bert-base-uncased",
        "checkpoint": "prajjwal1/bert-tiny",  # a hub name, not a local path
        "tokenizer": "bert-base-uncased",
        "from": "results/teachers/t",  # an artifact: Snakemake tracks it
        "train": str((tmp_path / "results" / "teachers" / "t").absolute()),
        "validation": "./results/teachers/t",
        "test": "https://example.org/test.csv",
        "name": "data.csv",  # a local file, but not under a path key
        "teacher_backbone": None,
        "max_length": 32,
    }
    assert local_content(config) == {}
    config["test"] = "data.csv"  # the control: a local file under a path key counts
    assert local_content(config) == {"test": content_digest("data.csv")}


def test_nested_path_keys_are_named_with_dots_and_any_backbone_key_counts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "m").mkdir(parents=True)
    (tmp_path / "models" / "m" / "config.json").write_text('{"model_type": "bert"}')
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.csv").write_text("text,label\na,b\n")
    (tmp_path / "data" / "validation.csv").write_text("text,label\nc,d\n")
    config = {
        "model": {"init": {"from": "models/m", "layers": [0, 1]}, "config": {"tokenizer": "models/m"}},
        "method_args": {"meta_backbone": "models/m", "temperature": 2.0},
        "files": {"train": "data/train.csv", "validation": "data/validation.csv", "test": None},
    }
    found = local_content(config)
    model = content_digest("models/m")
    assert found == {
        "model.init.from": model,
        "model.config.tokenizer": model,
        "method_args.meta_backbone": model,
        "files.train": content_digest("data/train.csv"),
        "files.validation": content_digest("data/validation.csv"),
    }
    assert found["files.train"] != found["files.validation"]


# ---- the plan's slices


def news_csv(path: Path, rows: int = 48, word: str = "topic") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "label"])
        for i in range(rows):
            writer.writerow([f"row number {i} about {word} {i % 4}", "abcd"[i % 4]])
    return path


def load_plan(edit):
    from tests.test_plan import load

    return load(edit=edit)


def test_a_local_dataset_file_is_in_the_prepare_slice_by_content(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    news_csv(tmp_path / "data" / "news.csv")

    def local_source(config):
        config["dataset"]["source"] = "data/news.csv"

    before = load_plan(local_source).prepare_params()
    assert before["local_content"] == {"source": content_digest("data/news.csv")}
    news_csv(tmp_path / "data" / "news.csv", word="subject")  # edited in place: same path, other rows
    after = load_plan(local_source).prepare_params()
    assert after["local_content"]["source"] != before["local_content"]["source"]
    assert {k: v for k, v in after.items() if k != "local_content"} == {
        k: v for k, v in before.items() if k != "local_content"
    }
    assert "local_content" not in load_plan(None).prepare_params()  # builtin:bbc_news


def test_a_local_backbone_is_in_its_teachers_slice_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backbone = tmp_path / "models" / "bb"
    backbone.mkdir(parents=True)
    (backbone / "config.json").write_text('{"model_type": "bert"}')

    def local_backbone(config):
        config["teachers"]["ta"]["backbone"] = "models/bb"
        config["students"]["s_vkd"]["model"] = {"init": {"from": "models/bb"}}

    plan = load_plan(local_backbone)
    assert plan.teacher_params("ta")["local_content"] == {"backbone": content_digest(backbone)}
    assert plan.teacher_params("tb")["backbone"] == "builtin:tiny-bert"
    assert "local_content" not in plan.teacher_params("tb")
    assert plan.student_params("s_vkd")["local_content"] == {"model.init.from": content_digest(backbone)}
    assert "local_content" not in plan.student_params("s_none")

    before = plan.teacher_params("ta")
    (backbone / "config.json").write_text('{"model_type": "bert", "hidden_size": 64}')  # replaced in place
    assert load_plan(local_backbone).teacher_params("ta") != before


def test_a_local_prototypes_backbone_is_in_the_prototypes_slice(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    backbone = tmp_path / "models" / "raw"
    backbone.mkdir(parents=True)
    (backbone / "config.json").write_text('{"model_type": "bert"}')

    def local_backbone(config):
        config.setdefault("prototypes", {})["backbone"] = "models/raw"

    before = load_plan(local_backbone).prototype_params()
    assert before["backbone"] == "models/raw"
    (backbone / "config.json").write_text('{"model_type": "bert", "hidden_size": 64}')  # replaced in place
    after = load_plan(local_backbone).prototype_params()
    assert after.get("local_content") == {"backbone": content_digest(backbone)}
    assert after != before


# ---- job_identity


@pytest.fixture
def artifacts(tmp_path, monkeypatch):
    """A dataset folder (its manifest and a parquet-like file), a signal file with its manifest beside it, and an
    unrelated folder."""
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "results" / "data" / "tiny"
    data.mkdir(parents=True)
    (data / "train.parquet").write_bytes(b"rows" * 100)
    write_manifest(data / "manifest.json", {"kind": "dataset", "rows": 10}, ["train.parquet"])
    (data / "labels.json").write_text('["a", "b"]')
    signals = tmp_path / "results" / "signals" / "t"
    signals.mkdir(parents=True)
    (signals / "logits.train.npy").write_bytes(b"\x01" * 64)
    write_manifest(signals / "logits.train.json", {"kind": "logits"}, ["logits.train.npy"])
    other = tmp_path / "results" / "data" / "other"
    other.mkdir(parents=True)
    (other / "manifest.json").write_text('{"rows": 1}')
    return data, signals / "logits.train.npy", other


PARAMS = {"backbone": "builtin:tiny-bert", "lr": 1e-3, "epochs": 1}
CODE = "0123456789abcdef"  # a stage's code fingerprint


@dataclass(frozen=True)
class Params(Settings):
    """The settings of a stage that reads :data:`PARAMS`."""

    backbone: str
    lr: float
    epochs: int
    local_content: Mapping[str, str] | None = None


def settings(params: dict = PARAMS, **keys) -> Params:
    return Params.from_params({**params, **keys}, "test")


def test_job_identity_changes_with_params_and_input_manifests(artifacts):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(settings(), inputs, CODE)
    assert job_identity(settings(), inputs, CODE) == base
    assert (
        job_identity(settings(dict(reversed(PARAMS.items()))), list(reversed(inputs)), CODE) == base
    )  # no order counts
    assert job_identity(settings(lr=2e-3), inputs, CODE) != base
    assert job_identity(settings(local_content={"backbone": "xxh3_128:00"}), inputs, CODE) != base

    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "rows": 11}))  # another dataset artifact
    changed = job_identity(settings(), inputs, CODE)
    assert changed != base
    (data / "labels.json").write_text('["a", "c"]')  # any JSON file of an input folder counts
    assert job_identity(settings(), inputs, CODE) != changed


def test_job_identity_reads_a_signal_file_by_its_recorded_checksum(artifacts):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(settings(), inputs, CODE)
    manifest_file = signal.with_name("logits.train.json")
    manifest = json.loads(manifest_file.read_text())
    manifest["checksums"][signal.name] = "xxh3_64:0123456789abcdef"  # another signal was recorded
    manifest_file.write_text(json.dumps(manifest))
    assert job_identity(settings(), inputs, CODE) != base

    # a file no manifest describes counts by its bytes
    loose = Path("results") / "loose.bin"
    loose.write_bytes(b"one")
    with_loose = job_identity(settings(), [*inputs, str(loose)], CODE)
    loose.write_bytes(b"two")
    assert job_identity(settings(), [*inputs, str(loose)], CODE) != with_loose


def test_job_identity_changes_with_the_code_fingerprint_which_covers_library_versions(artifacts, monkeypatch):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(settings(), inputs, CODE)
    assert job_identity(settings(), inputs, "fedcba9876543210") != base
    code = fingerprint.fingerprint("kdpipe.stages.finetune_teacher")
    versions = dict(identity.software_versions())
    assert set(versions) == {"torch", "transformers", "tokenizers"}
    monkeypatch.setattr(fingerprint, "software_versions", lambda: {**versions, "transformers": "0.0.1"})
    assert fingerprint.fingerprint("kdpipe.stages.finetune_teacher") != code
    monkeypatch.setattr(fingerprint, "software_versions", lambda: {**versions, "torch": "0.0.1"})
    assert fingerprint.fingerprint("kdpipe.stages.finetune_teacher") != code
    monkeypatch.setattr(fingerprint, "software_versions", lambda: dict(versions))
    assert fingerprint.fingerprint("kdpipe.stages.finetune_teacher") == code


def test_what_changed_names_the_parts_of_two_identities_that_differ(artifacts):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(settings(), inputs, CODE)
    assert what_changed(base, job_identity(settings(), inputs, "fedcba9876543210")) == "other code"
    assert what_changed(base, job_identity(settings(lr=2), inputs, CODE)) == "other settings"
    assert what_changed(base, job_identity(settings(lr=2), inputs[:1], CODE)) == "other settings and inputs"
    assert what_changed(job_identity(settings(), inputs[:1], "0"), base) == "other inputs and code"
    assert what_changed('{"lr": 1}', base) == "other settings, inputs or code"  # a key of another form


def test_job_identity_ignores_files_outside_its_inputs(artifacts):
    data, signal, other = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(settings(), inputs, CODE)
    (other / "manifest.json").write_text('{"rows": 2}')
    (other / "new.json").write_text("{}")
    (data.parent / "tiny.log").write_text("a log beside the input")
    assert job_identity(settings(), inputs, CODE) == base
    assert job_identity(settings(), [*inputs, str(other)], CODE) != base  # the control: as an input it counts


def test_a_job_stops_when_a_local_file_changed_after_the_plan_digested_it(tmp_path):
    """The plan digests a local file into the slice when it builds the DAG; a job that starts after an edit would
    read the new bytes under the old identity (and the shared cache would file them so)."""
    from kdpipe.cli import _check_local_content as check_local_content
    from kdpipe.core.store import KdpipeError
    from kdpipe.plan.slices import with_local_content

    extra = tmp_path / "extra.csv"
    extra.write_text("text\na\n")
    params = with_local_content({"transfer": [str(extra)], "name": "x"})
    check_local_content(params)  # unchanged: the job runs
    check_local_content({"name": "x"})  # a slice that names no local file
    extra.write_text("text\nb\n")
    with pytest.raises(KdpipeError, match=r"transfer\[0\]: the file or folder changed after the workflow was planned"):
        check_local_content(params)


# ---- the code a job runs is the code it was scheduled with


def test_a_job_stops_when_its_code_changed_after_it_was_scheduled(tmp_path):
    """An edit of kdpipe between the moment Snakemake scheduled a job (its ``--code``) and the moment it starts (it
    waited for the shared cache's lock): the job stops before anything, in one line naming both fingerprints; with
    the fingerprint of the code as it is, it goes on."""
    import shutil
    import subprocess
    import sys

    from tests.conftest import REPO, TINY_TEACHER

    project = tmp_path / "project"
    shutil.copytree(REPO / "kdpipe", project / "kdpipe", ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(project)}
    stage = "kdpipe.stages.finetune_teacher"
    scheduled = fingerprint.fingerprint(stage)  # this checkout's code, the same as the copy's

    def job(code: str, out: str = "teachers/t", **more: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "kdpipe", "finetune-teacher", "--params", json.dumps(TINY_TEACHER)]
        cmd += ["--data", str(tmp_path / "no-data"), "--out", str(tmp_path / out), "--code", code]
        return subprocess.run(cmd, cwd=project, env={**env, **more}, capture_output=True, text=True, timeout=300)

    # a job in another environment (conda) than the workflow's: its library versions are the workflow's
    other = {"torch": "0.0-elsewhere"}
    code = fingerprint.fingerprint(stage, versions=other)
    elsewhere = job(code, "elsewhere/t", **{fingerprint.VERSIONS_ENV: json.dumps(other)})
    assert "code changed" not in elsewhere.stderr and "no-data" in elsewhere.stderr

    loop = project / "kdpipe/training/loop.py"
    loop.write_text(loop.read_text() + "\nEDITED = True  # an edit of the teacher's training loop\n")
    now = subprocess.run(
        [sys.executable, "-c", f"from kdpipe.core.fingerprint import fingerprint; print(fingerprint({stage!r}))"],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert now != scheduled
    stopped = job(scheduled)
    assert stopped.returncode == 2
    (line,) = stopped.stderr.splitlines()
    assert line == (
        f"kdpipe finetune-teacher: error: the kdpipe code changed after this job was scheduled (code fingerprint "
        f"{scheduled} then, {now} now); nothing was run: rerun Snakemake, which schedules the job again with the "
        f"code as it is now"
    )
    assert not (tmp_path / "teachers").exists()
    went_on = job(now)
    assert "code changed" not in went_on.stderr and "no-data" in went_on.stderr  # past the check, to the data


def test_any_stage_given_another_codes_fingerprint_stops_before_it_runs(tmp_path):
    """The check is not the training jobs' alone: a signal pass, a route or (here) prepare given the fingerprint of
    other code (``--code``) stops in one line and makes nothing."""
    import subprocess
    import sys

    out = tmp_path / "data"
    cmd = [sys.executable, "-m", "kdpipe", "prepare", "--params", "{}", "--out", str(out), "--code", "0123456789abcdef"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("kdpipe prepare: error: the kdpipe code changed after this job was scheduled (code ")
    assert "0123456789abcdef then" in done.stderr and not out.exists()


def test_a_job_fingerprints_again_the_modules_its_code_names():
    """``--code`` names the modules the stage imports by name after its fingerprint (the rules' ``code``): the job
    fingerprints its stage's module with exactly those, and stops when the fingerprint is not theirs."""
    from kdpipe.cli import check_code
    from kdpipe.core.store import KdpipeError
    from kdpipe.stages.catalog import STAGES

    stage = STAGES["evaluate"]
    named = ["kdpipe.models.onnx_model", "kdpipe.evaluation.exported"]
    check_code(stage, fingerprint.fingerprint(stage.module, *named) + ":" + ",".join(named))
    check_code(stage, fingerprint.fingerprint(stage.module))
    with pytest.raises(KdpipeError, match="the kdpipe code changed after this job was scheduled"):
        check_code(stage, fingerprint.fingerprint(stage.module) + ":" + ",".join(named))
