"""One identity per job (docs/caching-and-reruns.md, "Rerun rules", "One identity per job", "Two runs at once"):
local files and folders by content, the plan's slices carrying those digests, the job identity over params, inputs
and library versions, and the shared cache's lock per identity between two processes."""

from __future__ import annotations

import csv
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kdpipe.core import identity, shared_cache
from kdpipe.core.checksums import checksum, write_manifest
from kdpipe.core.identity import content_digest, job_identity, local_content
from tests.conftest import REPO

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


def test_job_identity_changes_with_params_and_input_manifests(artifacts):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(PARAMS, inputs)
    assert job_identity(PARAMS, inputs) == base
    assert job_identity(dict(reversed(PARAMS.items())), list(reversed(inputs))) == base  # no order counts
    assert job_identity({**PARAMS, "lr": 2e-3}, inputs) != base
    assert job_identity({**PARAMS, "local_content": {"backbone": "xxh3_128:00"}}, inputs) != base

    manifest = json.loads((data / "manifest.json").read_text())
    (data / "manifest.json").write_text(json.dumps({**manifest, "rows": 11}))  # another dataset artifact
    changed = job_identity(PARAMS, inputs)
    assert changed != base
    (data / "labels.json").write_text('["a", "c"]')  # any JSON file of an input folder counts
    assert job_identity(PARAMS, inputs) != changed


def test_job_identity_reads_a_signal_file_by_its_recorded_checksum(artifacts):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(PARAMS, inputs)
    manifest_file = signal.with_name("logits.train.json")
    manifest = json.loads(manifest_file.read_text())
    manifest["checksums"][signal.name] = "xxh3_64:0123456789abcdef"  # another signal was recorded
    manifest_file.write_text(json.dumps(manifest))
    assert job_identity(PARAMS, inputs) != base

    # a file no manifest describes counts by its bytes
    loose = Path("results") / "loose.bin"
    loose.write_bytes(b"one")
    with_loose = job_identity(PARAMS, [*inputs, str(loose)])
    loose.write_bytes(b"two")
    assert job_identity(PARAMS, [*inputs, str(loose)]) != with_loose


def test_job_identity_changes_with_library_versions(artifacts, monkeypatch):
    data, signal, _ = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(PARAMS, inputs)
    versions = dict(identity.software_versions())
    assert set(versions) == {"torch", "transformers", "tokenizers"}
    monkeypatch.setattr(identity, "software_versions", lambda: {**versions, "transformers": "0.0.1"})
    assert job_identity(PARAMS, inputs) != base
    monkeypatch.setattr(identity, "software_versions", lambda: {**versions, "torch": "0.0.1"})
    assert job_identity(PARAMS, inputs) != base
    monkeypatch.setattr(identity, "software_versions", lambda: dict(versions))
    assert job_identity(PARAMS, inputs) == base


def test_job_identity_ignores_files_outside_its_inputs(artifacts):
    data, signal, other = artifacts
    inputs = [str(data), str(signal)]
    base = job_identity(PARAMS, inputs)
    (other / "manifest.json").write_text('{"rows": 2}')
    (other / "new.json").write_text("{}")
    (data.parent / "tiny.log").write_text("a log beside the input")
    assert job_identity(PARAMS, inputs) == base
    assert job_identity(PARAMS, [*inputs, str(other)]) != base  # the control: as an input it counts


# ---- the shared cache: one lock per identity (docs/caching-and-reruns.md, "Two runs at once")

HOLDER = """
import os, sys
from pathlib import Path
from kdpipe.core import shared_cache
from kdpipe.core.checksums import write_manifest
identity, out, mode = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
assert shared_cache.claim(identity, [out]) is False
print("locked", flush=True)
sys.stdin.readline()
if mode == "fail":
    sys.exit(1)
tmp = out.with_name(out.name + ".tmp")
tmp.mkdir(parents=True)
(tmp / "model.safetensors").write_bytes(os.urandom(4096))
(tmp / "labels.json").write_text('["a", "b"]')
write_manifest(tmp / "manifest.json", {"kind": "teacher"}, ["model.safetensors", "labels.json"])
os.rename(tmp, out)
shared_cache.record(identity, [out])
if mode == "store":  # what Snakemake's output cache does: move the output into the cache, link it back
    entry = Path(os.environ[shared_cache.CACHE_ENV]) / f"entry-{identity}"
    os.rename(out, entry)
    out.symlink_to(entry, target_is_directory=True)
print("done", flush=True)
"""

WAITER = """
import sys
from pathlib import Path
from kdpipe.core import shared_cache
shared_cache.STORE_WAIT_S = float(sys.argv[3])
try:
    made = shared_cache.claim(sys.argv[1], [Path(sys.argv[2])])
    print("copied" if made else "make it", flush=True)
except shared_cache.StoredMeanwhile as err:
    print("stored meanwhile", err, flush=True)
"""


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def pump():
        for line in stream:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _wait_for(lines: queue.Queue, text: str | tuple[str, ...], timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        seen.append(line)
        if any(t in line for t in ((text,) if isinstance(text, str) else text)):
            return line
    raise AssertionError(f"no line with {text!r} within {timeout} s; got {seen}")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir()
    monkeypatch.setenv(shared_cache.CACHE_ENV, str(folder))
    yield folder
    for handle in shared_cache._HELD.values():  # locks this test process took
        handle.close()
    shared_cache._HELD.clear()


class Race:
    """A holder process that claims ``identity`` for ``out_a`` and a waiter that claims it for ``out_b``."""

    def __init__(self, tmp_path: Path, identity: str, mode: str, store_wait_s: float = 1.0):
        self.out_a, self.out_b = tmp_path / "runA" / "teachers" / "t", tmp_path / "runB" / "teachers" / "t"
        self.out_a.parent.mkdir(parents=True)
        self.out_b.parent.mkdir(parents=True)
        self.identity = identity
        self.holder = subprocess.Popen(
            [sys.executable, "-c", HOLDER, identity, str(self.out_a), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.holder_out = _lines(self.holder.stdout)
        self.waiter = None
        try:
            _wait_for(self.holder_out, "locked")
        except AssertionError:
            self.close()
            raise
        self.waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, identity, str(self.out_b), str(store_wait_s)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.waiter_out, self.waiter_err = _lines(self.waiter.stdout), _lines(self.waiter.stderr)

    def release(self) -> None:
        self.holder.stdin.write("go\n")
        self.holder.stdin.flush()

    def close(self) -> None:
        for proc in (self.holder, self.waiter):
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                proc.wait(timeout=30)


def _teacher_folder(path: Path) -> Path:
    """A finished teacher folder as another run's job leaves it: weights and their manifest."""
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"weights")
    write_manifest(path / "manifest.json", {"kind": "teacher"}, ["model.safetensors"])
    return path


def _record(cache: Path, identity: str, output: Path) -> Path:
    """Another run's record that its job of ``identity`` made ``output``."""
    locks = cache / shared_cache.LOCKS
    locks.mkdir(exist_ok=True)
    record = locks / f"{identity}.json"
    record.write_text(json.dumps({"outputs": [str(output)]}))
    return record


def test_a_job_that_waited_copies_the_other_runs_finished_output(cache, tmp_path):
    race = Race(tmp_path, "id-copy", "finish")
    try:
        waiting = _wait_for(race.waiter_err, "waiting")
        assert f"{race.out_b}: another run sharing the cache is making it (pid {race.holder.pid} on " in waiting
        assert not race.out_b.exists()
        race.release()
        _wait_for(race.holder_out, "done")
        assert race.holder.wait(timeout=60) == 0
        assert _wait_for(race.waiter_out, "copied") == "copied\n"
        assert race.waiter.wait(timeout=60) == 0
        assert f"{race.out_b}: copied from {race.out_a.absolute()}" in _wait_for(race.waiter_err, "copied from")
    finally:
        race.close()
    assert not race.out_b.is_symlink() and race.out_b.is_dir()
    assert sorted(p.name for p in race.out_b.iterdir()) == ["labels.json", "manifest.json", "model.safetensors"]
    for name in ("labels.json", "manifest.json", "model.safetensors"):
        assert (race.out_b / name).read_bytes() == (race.out_a / name).read_bytes()
        assert (race.out_b / name).stat().st_ino != (race.out_a / name).stat().st_ino
    manifest = json.loads((race.out_b / "manifest.json").read_text())
    assert manifest["checksums"]["model.safetensors"] == checksum(race.out_b / "model.safetensors")
    record = json.loads((cache / shared_cache.LOCKS / "id-copy.json").read_text())
    assert record == {"outputs": [str(race.out_a.absolute())]}


def test_a_job_that_waited_stops_when_the_other_run_stored_its_output(cache, tmp_path):
    race = Race(tmp_path, "id-stored", "store", store_wait_s=30.0)
    try:
        _wait_for(race.waiter_err, "waiting")
        race.release()
        assert race.holder.wait(timeout=60) == 0
        assert race.out_a.is_symlink()
        said = _wait_for(race.waiter_out, "stored meanwhile")
        assert f"{race.out_b}: made meanwhile by another run sharing the cache and stored there" in said
        assert race.waiter.wait(timeout=60) == 0
    finally:
        race.close()
    assert not race.out_b.exists()  # nothing made, nothing copied: Snakemake's retry links the cache entry


def test_a_job_that_waited_for_a_failed_job_makes_its_output(cache, tmp_path):
    """The other job failed after taking the lock; a record of an earlier run of the same job is older than the
    wait: neither is taken for a finished output."""
    old = _teacher_folder(tmp_path / "old" / "t")
    race = Race(tmp_path, "id-failed", "fail")
    try:
        _wait_for(race.waiter_err, "waiting")
        record = _record(cache, "id-failed", old)
        os.utime(record, (time.time() - 3600, time.time() - 3600))
        race.release()
        assert race.holder.wait(timeout=60) == 1
        assert _wait_for(race.waiter_out, "make it") == "make it\n"
        assert race.waiter.wait(timeout=60) == 0
    finally:
        race.close()
    assert not race.out_b.exists()


def test_a_record_older_than_the_claim_is_ignored(cache, tmp_path):
    record = _record(cache, "id-old", _teacher_folder(tmp_path / "runA" / "t"))  # an earlier run's, no one waits
    written = time.time() - 2 * shared_cache.STORE_WAIT_S
    os.utime(record, (written, written))
    locks = cache / shared_cache.LOCKS
    out = tmp_path / "runB" / "t"
    assert shared_cache.claim("id-old", [out]) is False
    assert not out.exists()
    assert (locks / "id-old.lock").is_file()
    shared_cache.record("id-old", [out])  # this process holds the lock: its record replaces the old one
    assert json.loads((locks / "id-old.json").read_text()) == {"outputs": [str(out.absolute())]}


def _stored_elsewhere(cache: Path, tmp_path: Path, identity: str) -> Path:
    """Another run's teacher output, stored: a link to an entry of the cache, and a fresh record of it."""
    stored = tmp_path / "runA" / identity
    stored.parent.mkdir(exist_ok=True)
    stored.symlink_to(_teacher_folder(cache / f"entry-{identity}"))
    _record(cache, identity, stored)
    return stored


def test_a_job_started_just_after_the_other_run_finished_stops_when_that_run_stored_it(cache, tmp_path, monkeypatch):
    """The lock is free (the other run's job has ended), but that run's Snakemake stored the output after this run
    looked the job up: the fresh record says so, and the job stops instead of training it a second time (whose
    store would nest a second copy inside the entry)."""
    monkeypatch.setenv(shared_cache.CACHED_RUN_ENV, "1")
    _stored_elsewhere(cache, tmp_path, "id-fresh")
    out = tmp_path / "runB" / "t"
    with pytest.raises(shared_cache.StoredMeanwhile, match="moments before this job started and stored there"):
        shared_cache.claim("id-fresh", [out])
    assert not out.exists()


def test_a_fresh_stored_record_is_ignored_by_a_run_without_the_cache(cache, tmp_path, monkeypatch):
    """A run without --cache never looks the cache up or stores: its job makes its own output (--forcerun too)."""
    monkeypatch.delenv(shared_cache.CACHED_RUN_ENV, raising=False)
    _stored_elsewhere(cache, tmp_path, "id-nocache")
    assert shared_cache.claim("id-nocache", [tmp_path / "runB" / "t"]) is False


def test_a_record_dated_in_the_future_or_a_dangling_link_is_ignored(cache, tmp_path, monkeypatch):
    monkeypatch.setenv(shared_cache.CACHED_RUN_ENV, "1")
    monkeypatch.setattr(shared_cache, "STORE_WAIT_S", 0.3)
    _stored_elsewhere(cache, tmp_path, "id-future")
    record = cache / shared_cache.LOCKS / "id-future.json"
    os.utime(record, (time.time() + 3600, time.time() + 3600))  # a file server's clock an hour ahead
    assert shared_cache.claim("id-future", [tmp_path / "runB" / "t1"]) is False
    stored = _stored_elsewhere(cache, tmp_path, "id-dangling")
    shutil.rmtree(stored.resolve())  # the entry was deleted since (age clean-up)
    assert shared_cache.claim("id-dangling", [tmp_path / "runB" / "t2"]) is False


def test_a_fresh_record_of_an_output_not_stored_is_not_copied_without_a_wait(cache, tmp_path, monkeypatch):
    """Another working directory made the same teacher seconds ago and does not cache it: a job that did not wait
    for it makes its own after waiting for a store that does not come (copying is for jobs that waited)."""
    monkeypatch.setenv(shared_cache.CACHED_RUN_ENV, "1")
    monkeypatch.setattr(shared_cache, "STORE_WAIT_S", 0.3)
    _record(cache, "id-unstored", _teacher_folder(tmp_path / "runA" / "t"))
    out = tmp_path / "runB" / "t"
    assert shared_cache.claim("id-unstored", [out]) is False
    assert not out.exists()


def test_a_fresh_record_of_the_jobs_own_output_is_not_taken(cache, tmp_path):
    out = tmp_path / "runA" / "t"
    _record(cache, "id-own", out)  # an earlier try of this job
    assert shared_cache.claim("id-own", [out]) is False


def test_without_a_cache_folder_claim_does_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(shared_cache.CACHE_ENV, raising=False)
    out = tmp_path / "teachers" / "t"
    assert shared_cache.claim("id-none", [out]) is False
    shared_cache.record("id-none", [out])
    assert "id-none" not in shared_cache._HELD
    assert list(tmp_path.iterdir()) == []

    missing = tmp_path / "no-such-cache"
    monkeypatch.setenv(shared_cache.CACHE_ENV, str(missing))
    assert shared_cache.claim("id-none", [out]) is False
    assert not missing.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "processes",
    [
        1,
        2,
    ],
)
def test_a_teacher_job_holds_its_cache_lock_while_it_trains(processes, cache, tiny_data, tmp_path):
    from kdpipe.training.loop import read_resume_state
    from tests.conftest import TINY_TEACHER

    out = tmp_path / "runA" / "teachers" / "t"
    params = {**TINY_TEACHER, "epochs": 40}
    job = subprocess.Popen(
        [sys.executable, "-m", "kdpipe", "--threads", "2", "--processes", str(processes), "finetune-teacher"]
        + ["--params", json.dumps(params), "--data", str(tiny_data), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        cwd=REPO,
    )
    waiter = None
    try:
        resume = out.parent / ".resume" / "t"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (read_resume_state(resume) or {}).get("epoch", 0) < 1:
            assert job.poll() is None, "the job ended early"
            time.sleep(0.1)
        (lock,) = (cache / shared_cache.LOCKS).glob("*.lock")  # the job's identity
        assert job.poll() is None and not out.exists()  # it trains
        waiter = subprocess.Popen(
            [sys.executable, "-c", WAITER, lock.stem, str(tmp_path / "runB" / "teachers" / "t"), "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
        )
        said = _wait_for(_lines(waiter.stdout), ("waiting", "make it"), timeout=30)
        assert job.poll() is None, "the job ended before the second one asked"
        assert "another run sharing the cache is making it" in said and "waiting" in said
    finally:
        if job.poll() is None:
            os.killpg(job.pid, 9)
        job.wait(timeout=30)
        if waiter is not None:
            if waiter.poll() is None:
                waiter.kill()
            waiter.wait(timeout=30)


def test_a_job_stops_when_a_local_file_changed_after_the_plan_digested_it(tmp_path):
    """The plan digests a local file into the slice when it builds the DAG; a job that starts after an edit would
    read the new bytes under the old identity (and the shared cache would file them so)."""
    from kdpipe.core.identity import check_local_content
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
