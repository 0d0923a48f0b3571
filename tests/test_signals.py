"""Signal artifacts: readers check files against manifests and data; feature dumps have the right shapes."""

import numpy as np
import pytest
import torch

from kdpipe.core.store import ArtifactError, make_manifest, write_json
from kdpipe.data.batching import collate, encode
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.signals.features import dump_bytes, dump_feature
from kdpipe.signals.io import read_logits, write_logits

ROWS = np.array([3, 5, 8], dtype=np.int64)


def write_signal(path, logits, labels, rows=None, row_ids=ROWS):
    write_logits(path, row_ids, logits)
    write_json(
        path.with_name("logits.json"),
        make_manifest("logits", split="train", rows=len(logits) if rows is None else rows, labels=labels),
    )


def test_logits_round_trip(tmp_path):
    logits = np.arange(6, dtype=np.float32).reshape(3, 2)
    write_signal(tmp_path / "logits.parquet", logits, ["a", "b"])
    got, labels = read_logits(tmp_path / "logits.parquet", ROWS, ["a", "b"])
    np.testing.assert_array_equal(got, logits)
    assert labels == ["a", "b"]


@pytest.mark.parametrize(
    "case, message",
    [
        ("manifest_rows", r"logits\.parquet: holds 3 rows but its manifest .* says 4"),
        ("data_rows", r"made for 3 rows of split 'train', but the data split has 2 rows"),
        ("labels", r"has 2 classes per row but its manifest lists 3 labels"),
        ("expected_labels", r"label list \['a', 'b'\] differs from the expected \['a', 'c'\]"),
        ("row_ids", r"row_ids are not those of the data split"),
    ],
)
def test_mismatches_are_reported_with_the_file(tmp_path, case, message):
    path = tmp_path / "logits.parquet"
    logits = np.zeros((3, 2), np.float32)
    write_signal(
        path, logits, ["a", "b", "c"] if case == "labels" else ["a", "b"], rows=4 if case == "manifest_rows" else None
    )
    row_ids = {"data_rows": ROWS[:2], "row_ids": np.array([3, 5, 9])}.get(case, ROWS)
    expected = ["a", "c"] if case == "expected_labels" else None
    with pytest.raises(ArtifactError, match=message):
        read_logits(path, row_ids, expected)


@pytest.fixture(scope="module")
def encoded():
    return encode(load_tokenizer("builtin:tiny-bert"), ["a short one", "a somewhat longer text here"], max_length=16)


def test_hidden_dump_keeps_each_rows_own_tokens(tmp_path, encoded):
    """Packed: row 0's tokens then row 1's, [len_0 + len_1, layers, H], no padding; each row as the model gives it
    alone (no padding in its batch of one), to float16 rounding."""
    model = load_classifier("builtin:tiny-bert", ["x", "y"], seed=0).eval()
    out = tmp_path / "hidden.npy"
    rows = dump_feature(model, encoded, "hidden", [0, 2], out, batch_size=2, device=torch.device("cpu"))
    assert rows.tolist() == [0, 1]
    lengths = encoded.lengths
    arr = np.load(out, mmap_mode="r")
    assert arr.shape == (int(lengths.sum()), 2, 32) and arr.dtype == np.float16
    assert dump_bytes("hidden", 2, 32, 2, lengths) == out.stat().st_size - 128 == 2 * 2 * 32 * int(lengths.sum())
    start = 0
    for i, n in enumerate(lengths):
        with torch.no_grad():
            alone = model(collate(encoded, np.array([i]))["input_ids"], output_hidden_states=True).hidden_states
        want = torch.stack([alone[0][0], alone[2][0]], 1).numpy()  # [len, layers, H]
        np.testing.assert_allclose(arr[start : start + n].astype(np.float32), want, atol=2e-3, rtol=2e-3)
        start += n


def test_attention_dump_needs_eager_attention(tmp_path, encoded):
    sdpa = load_classifier("builtin:tiny-bert", ["x", "y"], seed=0, attn="sdpa")
    with pytest.raises(ArtifactError, match="eager"):
        dump_feature(
            sdpa, encoded, "attentions", [1], tmp_path / "attentions.npy", batch_size=2, device=torch.device("cpu")
        )
    eager = load_classifier("builtin:tiny-bert", ["x", "y"], seed=0, attn="eager")
    out = tmp_path / "eager" / "attentions.npy"  # (a dump is named after its feature)
    out.parent.mkdir()
    dump_feature(eager, encoded, "attentions", [1, 2], out, batch_size=2, device=torch.device("cpu"))
    arr = np.load(out)
    short, long = (int(n) for n in encoded.lengths)
    assert arr.shape == (2 * 2 * (short**2 + long**2),)  # layers x heads x len² per row, flat
    second = arr[2 * 2 * short**2 :].reshape(2, 2, long, long)  # row 1: [layers, heads, len, len]
    # post-softmax probabilities: each query row sums to 1 over the keys
    np.testing.assert_allclose(second[0, 0].astype(np.float32).sum(-1), 1.0, atol=1e-2)
