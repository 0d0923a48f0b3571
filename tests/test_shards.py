"""Sharded signal passes: S shards gathered give byte-identical artifacts to one unsharded pass (fixed seed)."""

from pathlib import Path

import numpy as np
import pytest

from kdpipe.core.store import ArtifactError, KdpipeError
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.shards import gather, parse_shard, run, run_shard
from kdpipe.stages.finetune_teacher import run as finetune_teacher
from tests.conftest import TINY_TEACHER

MC = {"samples": 3, "seed": 7, "batch_size": 4, "max_batch_rows": 64, "split": "train", "signal": "mc"}
LOGITS = {"batch_size": 4, "split": "train", "signal": "logits"}
HIDDEN = {"batch_size": 4, "split": "train", "signal": "hidden", "layers": [0, 2]}


@pytest.fixture(scope="module")
def teacher(tiny_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("teacher") / "t"
    finetune_teacher(TINY_TEACHER, tiny_data, out)
    return out


def shards(count: int, root: Path, params: dict, teacher: Path, data: Path) -> list[Path]:
    parts = []
    for k in range(1, count + 1):
        part = root / f"part.{k}-of-{count}"
        run_shard(params["signal"], params, teacher, data, f"{k}-of-{count}", part)
        parts.append(part)
    return parts[::-1]  # the gather must not depend on the order of its inputs


def same_bytes(a: Path, b: Path, names: list[str]) -> None:
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("count", [2, 3, 20])  # 20: more shards than batches, some shards are empty
def test_mc_dropout_shards_gather_to_the_same_bytes(teacher, tiny_data, tmp_path, count):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    run("mc", MC, teacher, tiny_data, whole)
    gather("mc", MC, shards(count, tmp_path, MC, teacher, tiny_data), sharded)
    same_bytes(whole, sharded, ["mc.npy", "mc.parquet", "mc.json"])
    mean = np.load(whole / "mc.npy")
    assert mean.dtype == np.float32 and np.allclose(mean.sum(1), 1, atol=1e-5)


def test_logit_and_hidden_dumps_shard_to_the_same_bytes(teacher, tiny_data, tmp_path):
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    for params in (LOGITS, HIDDEN):
        run(params["signal"], params, teacher, tiny_data, whole)
        gather(params["signal"], params, shards(3, tmp_path / params["signal"], params, teacher, tiny_data), sharded)
    same_bytes(whole, sharded, ["logits.parquet", "logits.json", *SIGNALS["hidden"].files])


@pytest.mark.parametrize("count", [2, 20])  # 20: more shards than batches, some parts hold no row
@pytest.mark.parametrize("signal", ["attentions", "attentions_mean"])
def test_attention_dumps_shard_to_the_same_bytes(teacher, tiny_data, tmp_path, signal, count):
    params = {"batch_size": 4, "split": "train", "signal": signal, "layers": [1, 2]}
    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    run(signal, params, teacher, tiny_data, whole)
    gather(signal, params, shards(count, tmp_path / "parts", params, teacher, tiny_data), sharded)
    same_bytes(whole, sharded, list(SIGNALS[signal].files))


def test_the_gather_copies_runs_in_chunks(teacher, tiny_data, tmp_path, monkeypatch):
    """Chunks of a few tokens (instead of 64 MB) cut runs of rows anywhere: the same bytes."""
    from kdpipe.signals import rowfile

    whole, sharded = tmp_path / "whole", tmp_path / "sharded"
    run("hidden", HIDDEN, teacher, tiny_data, whole)
    parts = shards(3, tmp_path / "parts", HIDDEN, teacher, tiny_data)
    monkeypatch.setattr(rowfile, "CHUNK_BYTES", 3 * 2 * 2 * 32)  # 3 tokens of 2 layers x 32 floats16
    gather("hidden", HIDDEN, parts, sharded)
    same_bytes(whole, sharded, list(SIGNALS["hidden"].files))


def test_shards_that_tokenised_otherwise_are_refused(teacher, tiny_data, tmp_path):
    parts = shards(2, tmp_path, HIDDEN, teacher, tiny_data)
    tokens = np.load(parts[0] / "hidden.tokens.npy")
    tokens["token_hash"][0] += 1
    np.save(parts[0] / "hidden.tokens.npy", tokens)
    with pytest.raises(ArtifactError, match="tokenised the split otherwise"):
        gather("hidden", HIDDEN, parts, tmp_path / "out")


def test_a_missing_or_foreign_shard_is_refused(teacher, tiny_data, tmp_path):
    parts = shards(3, tmp_path, LOGITS, teacher, tiny_data)
    with pytest.raises(ArtifactError, match="do not cover the .* rows exactly once"):
        gather("logits", LOGITS, parts[:2], tmp_path / "out")
    other = shards(3, tmp_path / "mc", MC, teacher, tiny_data)
    with pytest.raises((ArtifactError, FileNotFoundError)):
        gather("logits", LOGITS, [*parts[:2], other[0]], tmp_path / "out")
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
