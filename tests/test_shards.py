"""Sharded signal passes: S shards gathered give byte-identical artifacts to one unsharded pass (fixed seed), and
to the whole pass written by its own job (S = 1); the shared forward pass gives each signal the bytes of a pass of
its own, and the bytes the code before the shared pass made."""

import json
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest

from kdpipe.core.store import ArtifactError, KdpipeError
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.parts import parse_shard
from kdpipe.signals.settings import PassSettings, SignalSettings
from kdpipe.signals.shards import gather, run_pass, run_shard
from kdpipe.stages.finetune_teacher import run as finetune_teacher
from tests.conftest import REPO, teacher_settings
from tests.conftest import run_one as run

MC = {"samples": 3, "seed": 7, "batch_size": 4, "max_batch_rows": 64, "split": "train", "signal": "mc"}
LOGITS = {"batch_size": 4, "split": "train", "signal": "logits"}
HIDDEN = {"batch_size": 4, "split": "train", "signal": "hidden", "layers": [0, 2]}
POOLED = {"batch_size": 4, "split": "train", "signal": "pooled"}
ATTENTIONS = {"batch_size": 4, "split": "train", "signal": "attentions", "layers": [1, 2]}
ATTENTIONS_MEAN = {**ATTENTIONS, "signal": "attentions_mean"}
FORWARD = [LOGITS, POOLED, HIDDEN, ATTENTIONS, ATTENTIONS_MEAN]  # every deterministic signal of the tiny teacher


def typed(params: dict) -> SignalSettings:
    """One signal's slice as the passes read it."""
    return SignalSettings.from_params(params, "signal")


def passing(signals: list[dict]) -> PassSettings:
    """A pass's slice, the slices of its signals, as the passes read it."""
    return PassSettings.from_params({"signals": signals}, "pass")


@pytest.fixture(scope="module")
def teacher(tiny_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("teacher") / "t"
    finetune_teacher(teacher_settings(), tiny_data, out)
    return out


def shards(count: int, root: Path, params: dict | list[dict], teacher: Path, data: Path) -> list[Path]:
    """The parts of ``count`` shards of the pass that makes the signal(s) of ``params``."""
    parts = []
    for k in range(1, count + 1):
        part = root / f"part.{k}-of-{count}"
        run_shard(passing(params if isinstance(params, list) else [params]), teacher, data, f"{k}-of-{count}", part)
        parts.append(part)
    return parts[::-1]  # the gather must not depend on the order of its inputs


def same_bytes(a: Path, b: Path, names: list[str]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def files_of(signals: list[dict]) -> list[str]:
    return [name for params in signals for name in SIGNALS[params["signal"]].files]


@pytest.mark.parametrize("count", [1, 3])
def test_the_shared_forward_gives_each_signal_the_bytes_of_its_own_pass(teacher, tiny_data, tmp_path, count):
    """Every deterministic signal from one job (S = 1, no gather job) or from S = 3 shards of the shared forward,
    gathered: the bytes of each signal made in a pass of its own."""
    alone, together = tmp_path / "alone", tmp_path / "together"
    for params in FORWARD:
        run(typed(params), teacher, tiny_data, alone)
    if count == 1:
        manifests = run_pass(passing(FORWARD), teacher, tiny_data, together)
        assert list(manifests) == [p["signal"] for p in FORWARD]
        assert sorted(p.name for p in together.iterdir()) == sorted(files_of(FORWARD)), "no part left behind"
    else:
        parts = shards(count, tmp_path / "parts", FORWARD, teacher, tiny_data)
        for params in FORWARD:
            gather(typed(params), parts, together)
    same_bytes(alone, together, files_of(FORWARD))


def test_mc_dropout_written_by_its_pass_job_is_the_gathered_bytes(teacher, tiny_data, tmp_path):
    """S = 1: the MC-dropout pass job writes the artifact itself, the same bytes as one shard gathered by a job."""
    whole, gathered = tmp_path / "whole", tmp_path / "gathered"
    run_pass(passing([MC]), teacher, tiny_data, whole)
    gather(typed(MC), shards(1, tmp_path / "parts", MC, teacher, tiny_data), gathered)
    same_bytes(whole, gathered, list(SIGNALS["mc"].files))


# The last commit before the shared forward pass: its per-signal passes are the reference bytes.
BEFORE_SHARED_FORWARD = "0f36feabe41b24bf8ea89a3612c305dc04d3d468"


def code_before(dest: Path) -> Path | None:
    """kdpipe as it was at :data:`BEFORE_SHARED_FORWARD`, extracted into ``dest`` (None without that history)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", BEFORE_SHARED_FORWARD, "kdpipe"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        return None
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest


@pytest.mark.slow
def test_the_shared_forward_makes_the_bytes_of_the_code_before_it(teacher, tiny_data, tmp_path):
    """Every deterministic signal (and MC-dropout) made by this code, all at once, has the bytes (artifacts and
    manifests, nothing left out) of the per-signal passes of the commit before the shared forward pass, run from
    that commit's own kdpipe in a separate process."""
    old = code_before(tmp_path / "before")
    if old is None:
        pytest.skip(f"commit {BEFORE_SHARED_FORWARD} is not in this checkout's history")
    script = (
        "import json, sys; from pathlib import Path; from kdpipe.signals.shards import run\n"
        "for params in json.loads(sys.argv[1]):\n"
        "    run(params['signal'], params, Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))\n"
    )
    signals = [*FORWARD, MC]
    env = {**os.environ, "PYTHONPATH": str(old)}
    args = [json.dumps(signals), str(teacher), str(tiny_data), str(tmp_path / "old")]
    subprocess.run([sys.executable, "-c", script, *args], env=env, cwd=tmp_path, check=True, timeout=600)
    run_pass(passing(FORWARD), teacher, tiny_data, tmp_path / "new")
    run_pass(passing([MC]), teacher, tiny_data, tmp_path / "new")
    same_bytes(tmp_path / "old", tmp_path / "new", files_of(signals))


@pytest.mark.parametrize("count", [2, 3, 20])  # 20: more shards than batches, some shards are empty
def test_mc_dropout_shards_gather_to_the_same_bytes(teacher, tiny_data, tmp_path, count):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    run(typed(MC), teacher, tiny_data, whole)
    gather(typed(MC), shards(count, tmp_path, MC, teacher, tiny_data), sharded)
    same_bytes(whole, sharded, ["mc.npy", "mc.parquet", "mc.json"])
    mean = np.load(whole / "mc.npy")
    assert mean.dtype == np.float32 and np.allclose(mean.sum(1), 1, atol=1e-5)


def test_logit_and_hidden_dumps_shard_to_the_same_bytes(teacher, tiny_data, tmp_path):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    for params in (LOGITS, HIDDEN):
        run(typed(params), teacher, tiny_data, whole)
        gather(typed(params), shards(3, tmp_path / params["signal"], params, teacher, tiny_data), sharded)
    same_bytes(whole, sharded, ["logits.parquet", "logits.json", *SIGNALS["hidden"].files])


@pytest.mark.parametrize("count", [2, 20])  # 20: more shards than batches, some parts hold no row
@pytest.mark.parametrize("signal", ["attentions", "attentions_mean"])
def test_attention_dumps_shard_to_the_same_bytes(teacher, tiny_data, tmp_path, signal, count):
    params = {"batch_size": 4, "split": "train", "signal": signal, "layers": [1, 2]}
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    run(typed(params), teacher, tiny_data, whole)
    gather(typed(params), shards(count, tmp_path / "parts", params, teacher, tiny_data), sharded)
    same_bytes(whole, sharded, list(SIGNALS[signal].files))


def test_the_gather_copies_runs_in_chunks(teacher, tiny_data, tmp_path, monkeypatch):
    """Chunks of a few tokens (instead of 64 MB) cut runs of rows anywhere: the same bytes."""
    from kdpipe.signals import rowfile

    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    run(typed(HIDDEN), teacher, tiny_data, whole)
    parts = shards(3, tmp_path / "parts", HIDDEN, teacher, tiny_data)
    monkeypatch.setattr(rowfile, "CHUNK_BYTES", 3 * 2 * 2 * 32)  # 3 tokens of 2 layers x 32 floats16
    gather(typed(HIDDEN), parts, sharded)
    same_bytes(whole, sharded, list(SIGNALS["hidden"].files))


def test_shards_that_tokenised_otherwise_are_refused(teacher, tiny_data, tmp_path):
    parts = shards(2, tmp_path, HIDDEN, teacher, tiny_data)
    tokens = np.load(parts[0] / "hidden/hidden.tokens.npy")
    tokens["token_hash"][0] += 1
    np.save(parts[0] / "hidden/hidden.tokens.npy", tokens)
    with pytest.raises(ArtifactError, match="tokenised the split otherwise"):
        gather(typed(HIDDEN), parts, tmp_path / "out")


def test_a_missing_or_foreign_shard_is_refused(teacher, tiny_data, tmp_path):
    parts = shards(3, tmp_path, LOGITS, teacher, tiny_data)
    with pytest.raises(ArtifactError, match="do not cover the .* rows exactly once"):
        gather(typed(LOGITS), parts[:2], tmp_path / "out")
    other = shards(3, tmp_path / "mc", MC, teacher, tiny_data)
    with pytest.raises((ArtifactError, FileNotFoundError)):
        gather(typed(LOGITS), [*parts[:2], other[0]], tmp_path / "out")
    assert not (tmp_path / "out" / "logits.parquet").exists()


@pytest.mark.parametrize("item, expected", [(None, (0, 1)), ("1-of-1", (0, 1)), ("3-of-4", (2, 4))])
def test_parse_shard(item, expected):
    assert parse_shard(item) == expected


@pytest.mark.parametrize("item", ["0-of-2", "3-of-2", "2of4", "a-of-b"])
def test_bad_shard_names(item):
    with pytest.raises(KdpipeError, match="expected 'k-of-S'"):
        parse_shard(item)


def test_row_files_hold_the_bytes_numpy_writes(tmp_path):
    """Rows written in any order and gathered in chunks give the file numpy.save writes for the same array, and
    read back as written."""
    from kdpipe.signals import rowfile
    from kdpipe.signals.rowfile import RowFile

    array = np.arange(7 * 3 * 2, dtype=np.float16).reshape(7, 3, 2)
    np.save(tmp_path / "reference.npy", array)
    with RowFile.create(tmp_path / "rows.npy", array.shape, np.float16) as out:
        out.write(np.array([6, 0, 1, 2]), array[[6, 0, 1, 2]])  # a run 0-2 and a lone row
        out.write(np.array([5, 3, 4]), array[[5, 3, 4]])
    assert (tmp_path / "rows.npy").read_bytes() == (tmp_path / "reference.npy").read_bytes()
    with RowFile.open(tmp_path / "rows.npy") as rows:
        assert np.array_equal(rows.read(2, 5), array[2:5])
        original, rowfile.CHUNK_BYTES = rowfile.CHUNK_BYTES, 2 * rows.row_bytes  # chunks of 2 rows
        try:
            assert [c for c in rows.chunks()] == [(0, 2), (2, 4), (4, 6), (6, 7)]
        finally:
            rowfile.CHUNK_BYTES = original
    (tmp_path / "short.npy").write_bytes((tmp_path / "rows.npy").read_bytes()[:-4])
    with RowFile.open(tmp_path / "short.npy") as short, pytest.raises(ValueError, match="truncated"):
        short.read(0, 7)
