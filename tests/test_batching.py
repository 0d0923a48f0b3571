"""Memory flat in N (docs/design.md, "Compute"): flat tokenised splits (kdpipe.data.batching.Encoded, Ragged,
Batches) give the same ids, batches and padded inputs as the list of one array per row they replace, and the
predictions table built from its columns is the bytes pandas wrote from one array object per row."""

from __future__ import annotations

import zlib

import numpy as np
import pandas as pd
import pytest

from kdpipe.data import batching
from kdpipe.data.batching import (
    Batches,
    Ragged,
    collate,
    encode,
    inference_batches,
    shard_batches,
    training_batches,
)
from kdpipe.models.loading import load_tokenizer

TEXTS = [
    "a short one",
    "",
    "a somewhat longer text here, with a comma and more words than the others have",
    "mid length text",
    "x",
    "the quick brown fox jumps over the lazy dog again and again",
    "tiny",
] * 5
PAIRS = ["its pair", "another", "", "a pair that is longer than most", "y", "z z z", "last"] * 5


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tiny-bert")


# ---- the list-of-arrays implementation the flat one replaced (kdpipe 0.1, before "a million rows on flat memory")


def old_rows(tokenizer, texts, pairs=None, max_length=16):
    out = tokenizer(texts, pairs, truncation=True, max_length=max_length, padding=False, return_attention_mask=False)
    return {k: [np.asarray(x, dtype=np.int64) for x in v] for k, v in out.items()}


def old_training_batches(lengths, batch_size, *, seed, epoch, window=50):
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    span = batch_size * window
    batches = []
    for start in range(0, len(order), span):
        chunk = order[start : start + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def old_inference_batches(lengths, batch_size):
    order = np.argsort(-lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def old_pad(rows, pad_id):
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for j, r in enumerate(rows):
        ids[j, : len(r)] = r
        mask[j, : len(r)] = 1
    return ids, mask


def old_collate(rows, index, pad_id, pair_rows=None):
    ids, mask = old_pad([rows["input_ids"][i] for i in index], pad_id)
    batch = {"input_ids": ids, "attention_mask": mask}
    if pair_rows is not None:
        batch["pair_input_ids"], batch["pair_attention_mask"] = old_pad([pair_rows[i] for i in index], pad_id)
    if "token_type_ids" in rows:
        types = np.zeros_like(ids)
        for j, i in enumerate(index):
            types[j, : len(rows["token_type_ids"][i])] = rows["token_type_ids"][i]
        batch["token_type_ids"] = types
    return batch


def old_hashes(ids, pairs=None):
    pairs = pairs if pairs is not None else [()] * len(ids)
    return np.array(
        [zlib.crc32(np.concatenate([a, np.asarray(p, dtype=np.int64)]).tobytes()) for a, p in zip(ids, pairs)]
    )


def same_batches(new, old) -> bool:
    return len(new) == len(old) and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(new, old))


# ---- tests


@pytest.mark.parametrize("pairs", [None, PAIRS])
def test_flat_encoded_batches_identical_to_lists(tokenizer, pairs):
    encoded = encode(tokenizer, TEXTS, pairs, max_length=16, labels=np.arange(len(TEXTS)) % 3)
    old = old_rows(tokenizer, TEXTS, pairs)
    assert isinstance(encoded.input_ids, Ragged) and encoded.input_ids.values.dtype == np.int32
    assert len(encoded) == len(TEXTS)
    assert [x.tolist() for x in encoded.input_ids] == [x.tolist() for x in old["input_ids"]]
    assert [x.tolist() for x in encoded.token_type_ids] == [x.tolist() for x in old["token_type_ids"]]
    lengths = np.array([len(x) for x in old["input_ids"]])
    assert np.array_equal(encoded.lengths, lengths) and encoded.lengths.dtype == np.int64
    assert np.array_equal(encoded.token_hashes, old_hashes(old["input_ids"]))
    for seed, epoch, size in ((0, 0, 4), (3, 2, 5), (1, 0, 64)):
        assert same_batches(
            training_batches(encoded.lengths, size, seed=seed, epoch=epoch, window=2),
            old_training_batches(lengths, size, seed=seed, epoch=epoch, window=2),
        )
        assert same_batches(
            training_batches(encoded.lengths, size, seed=seed, epoch=epoch),
            old_training_batches(lengths, size, seed=seed, epoch=epoch),
        )
    for size in (1, 4, 7, 100):
        batches = inference_batches(encoded.lengths, size)
        assert same_batches(batches, old_inference_batches(lengths, size))
        for shard in ((0, 1), (0, 3), (2, 3), (4, 9)):
            assert same_batches(
                shard_batches(batches, shard), old_inference_batches(lengths, size)[shard[0] :: shard[1]]
            )
    for index in training_batches(encoded.lengths, 4, seed=0, epoch=0):
        batch = collate(encoded, index)
        expected = old_collate(old, index, encoded.pad_id)
        assert set(batch) == {*expected, "index", "labels"}
        for key, value in expected.items():
            assert batch[key].dtype == torch_int64() and np.array_equal(batch[key].numpy(), value), key
        assert np.array_equal(batch["labels"].numpy(), encoded.labels[index])
        assert np.array_equal(batch["index"].numpy(), index)


@pytest.mark.parametrize("separate", [False, True])
def test_a_frames_columns_tokenise_as_lists(tokenizer, separate, monkeypatch):
    monkeypatch.setattr(batching, "TOKENIZE_CHUNK", 4)  # several chunks
    frame = pd.DataFrame({"text": TEXTS, "text_pair": PAIRS}, index=np.arange(len(TEXTS))[::-1])
    frame["row_id"] = np.arange(len(TEXTS)) + 100
    from_frame = batching.encode_frame(tokenizer, frame, max_length=16, separate_pairs=separate)
    from_lists = encode(tokenizer, TEXTS, PAIRS, max_length=16, separate_pairs=separate)
    for field in ("input_ids", "token_type_ids", "pair_ids"):
        a, b = getattr(from_frame, field), getattr(from_lists, field)
        assert (a is None) == (b is None)
        if a is not None:
            assert np.array_equal(a.values, b.values) and np.array_equal(a.offsets, b.offsets)
    assert np.array_equal(from_frame.row_ids, frame["row_id"])


def test_separate_pairs_flat(tokenizer):
    encoded = encode(tokenizer, TEXTS, PAIRS, max_length=16, separate_pairs=True)
    alone, other = old_rows(tokenizer, TEXTS), old_rows(tokenizer, PAIRS)
    assert encoded.token_type_ids is None
    assert np.array_equal(encoded.lengths, [len(a) + len(b) for a, b in zip(alone["input_ids"], other["input_ids"])])
    assert np.array_equal(encoded.token_hashes, old_hashes(alone["input_ids"], other["input_ids"]))
    index = np.array([5, 2, 0, 1])
    batch = collate(encoded, index)
    expected = old_collate({"input_ids": alone["input_ids"]}, index, encoded.pad_id, other["input_ids"])
    for key, value in expected.items():
        assert np.array_equal(batch[key].numpy(), value), key


def test_flat_edges(tokenizer):
    empty = encode(tokenizer, [], max_length=16)
    assert len(empty) == 0 and len(empty.input_ids) == 0 and len(empty.lengths) == 0
    assert len(training_batches(empty.lengths, 4, seed=0, epoch=0)) == 0
    assert len(inference_batches(empty.lengths, 4)) == 0 and not inference_batches(empty.lengths, 4)
    assert len(empty.token_hashes) == 0
    ragged = Ragged(np.array([1, 2, 3, 4, 5, 6], np.int32), np.array([0, 2, 2, 6]))
    assert [r.tolist() for r in ragged] == [[1, 2], [], [3, 4, 5, 6]] and ragged[-1].tolist() == [3, 4, 5, 6]
    with pytest.raises(IndexError):
        ragged[3]
    ids, mask = ragged.pad(np.array([1, 2, 0]), fill=9)
    assert ids.tolist() == [[9, 9, 9, 9], [3, 4, 5, 6], [1, 2, 9, 9]] and mask.sum(1).tolist() == [0, 4, 2]
    ids, mask = ragged.pad(np.array([1]), fill=9)
    assert ids.shape == (1, 0)
    column = batching._Column(4, 2, np.int8)  # room for 2 values: it grows, and widens past int8
    column.add([[1, 2], [3]])
    column.add([[], [300, 4, 5]])
    built = column.ragged()
    assert [r.tolist() for r in built] == [[1, 2], [3], [], [300, 4, 5]] and built.values.dtype == np.int64
    batches = Batches.cut(np.arange(10), 4)
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert [b.tolist() for b in batches[::2]] == [[0, 1, 2, 3], [8, 9]] and batches[-1].tolist() == [8, 9]
    assert [b.tolist() for b in batches.take(np.array([2, 0]))] == [[8, 9], [0, 1, 2, 3]]


def test_flat_memory_per_row(tokenizer):
    """A tokenised row costs its ids (4 bytes a token, 1 per token type) and an offset, not a Python object."""
    texts = ["a text of some words, long enough to be cut at sixteen word pieces by the tokenizer"] * 2000
    encoded = encode(tokenizer, texts, texts, max_length=16)
    held = sum(a.nbytes for r in (encoded.input_ids, encoded.token_type_ids) for a in (r.values, r.offsets))
    assert held / len(texts) <= 16 * 5 + 16 + 1


def torch_int64():
    import torch

    return torch.int64


def old_predictions(columns: dict, classes: list[str], path):
    """The predictions table as kdpipe wrote it before, through pandas."""
    frame = dict(columns)
    frame["label"], frame["pred"] = (np.asarray(classes)[frame[key]] for key in ("label", "pred"))
    frame["probs"] = list(frame["probs"].astype(np.float32))
    pd.DataFrame(frame).to_parquet(path, index=False)


@pytest.mark.parametrize("rows, classes, domains", [(500, 5, False), (37, 2, True), (1, 3, True)])
def test_predictions_table_is_the_bytes_pandas_wrote(tmp_path, rows, classes, domains):
    import pyarrow.parquet as pq

    from kdpipe.evaluation.metrics import uncertainty_split
    from kdpipe.evaluation.results import predictions_table

    rng = np.random.default_rng(rows)
    members = rng.dirichlet(np.ones(classes), size=(2, rows)).astype(np.float32)
    probs = members.mean(0)
    names = ["business", "entertainment", "politics", "sport", "tech"][:classes]
    y, pred = rng.integers(0, classes, rows), probs.argmax(1)
    columns = {
        "row_id": np.arange(rows) * 7,
        "label": y,
        "pred": pred,
        "correct": pred == y,
        "confidence": probs.max(1),
        "probs": probs,
        **uncertainty_split(members),
    }
    if domains:
        columns["domain"] = np.array(["news", "blogs"], dtype=object)[rng.integers(0, 2, rows)]
    old_predictions(columns, names, tmp_path / "old.parquet")
    pq.write_table(predictions_table(columns, names), tmp_path / "new.parquet", compression="snappy")
    assert (tmp_path / "new.parquet").read_bytes() == (tmp_path / "old.parquet").read_bytes()
