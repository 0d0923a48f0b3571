"""Tests of the prepare stage and the dataset artifact readers (kdpipe/data/prepare.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from kdpipe.core.store import ArtifactError, KdpipeError
from kdpipe.data.dataset import SPLITS, read_labels, read_split
from kdpipe.data.prepare import bbc_news_dir, prepare
from kdpipe.data.settings import DatasetSettings
from kdpipe.plan import checked_plan
from tests.conftest import REPO, dataset_settings

BBC_LABELS = ["business", "entertainment", "politics", "sport", "tech"]


def dataset_params(**overrides) -> DatasetSettings:
    """The dataset config slice with the schema defaults, as the workflow passes it, read as the prepare stage
    reads it."""
    params = {
        "name": "tiny",
        "source": "builtin:bbc_news",
        "files": None,
        "hf_splits": None,
        "format": "auto",
        "encoding": "utf-8",
        "text_column": "text",
        "text_pair_column": None,
        "label_column": "label",
        "domain_column": None,
        "split": {"validation": 0.1, "test": 0.2, "seed": 13},
        "max_rows": None,
        "max_per_class": None,
        "dedup": True,
    }
    return dataset_settings(params | overrides)


def tiny_frame(n: int = 40, labels=("neg", "pos"), pair: bool = False, domain: bool = False) -> pd.DataFrame:
    """``n`` distinct rows cycling through ``labels``, with optional text_pair/domain columns."""
    frame = pd.DataFrame(
        {"text": [f"sentence number {i}" for i in range(n)], "label": [labels[i % len(labels)] for i in range(n)]}
    )
    if pair:
        frame["hypothesis"] = [f"hypothesis {i}" for i in range(n)]
    if domain:
        frame["source"] = ["books" if i % 3 else "dvd" for i in range(n)]
    return frame


def write_table(frame: pd.DataFrame, path) -> str:
    """Write ``frame`` in the format named by the extension of ``path``."""
    suffix = path.suffix
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".tsv":
        frame.to_csv(path, sep="\t", index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_parquet(path, index=False)
    return str(path)


def all_splits(data_dir) -> dict[str, pd.DataFrame]:
    return {split: read_split(data_dir, split) for split in SPLITS}


@pytest.fixture(scope="module")
def bbc(tmp_path_factory):
    """The built-in BBC News dataset prepared once for the module: (manifest, splits, output dir)."""
    out = tmp_path_factory.mktemp("bbc") / "data"
    manifest = prepare(dataset_params(name="bbc_news"), out)
    return manifest, all_splits(out), out


# ---- built-in BBC News ---------------------------------------------------------------------------------------


def test_bbc_news_dir_holds_the_five_topic_folders():
    assert sorted(path.name for path in bbc_news_dir().iterdir()) == [
        "business",
        "entertainment",
        "politics",
        "sports",
        "tech",
    ]


def test_bbc_rows_duplicates_and_labels(bbc):
    manifest, splits, out = bbc
    # 98 exact copies, and 3 that differ only in a capital letter or a paragraph break (compared folded)
    assert manifest["duplicates_dropped"] == 101 and manifest["duplicates_by_split"] == {"train": 101}
    assert sum(manifest["rows"].values()) == 2124
    assert {split: len(frame) for split, frame in splits.items()} == manifest["rows"]
    assert manifest["labels"] == BBC_LABELS
    assert read_labels(out) == BBC_LABELS
    assert json.loads((out / "labels.json").read_text()) == BBC_LABELS
    assert manifest["label_renames"] == {"sports": "sport"}
    assert manifest["kind"] == "dataset" and manifest["source"] == "builtin:bbc_news"


def test_bbc_columns_and_dtypes(bbc):
    _, splits, _ = bbc
    for frame in splits.values():
        assert list(frame.columns) == ["row_id", "text", "label", "label_id"]
        assert frame["row_id"].dtype == "int64" and frame["label_id"].dtype == "int64"
        assert frame["row_id"].is_monotonic_increasing
        assert (frame["label"].map(BBC_LABELS.index) == frame["label_id"]).all()
        assert (frame["text"].str.len() > 0).all()


def test_bbc_latin1_file_is_read(bbc):
    _, splits, _ = bbc
    raw = (bbc_news_dir() / "sports" / "199.txt").read_bytes().decode("latin-1").strip()
    everything = pd.concat(splits.values())
    match = everything[everything["text"] == raw]
    assert len(match) == 1 and "£" in match["text"].iloc[0] and match["label"].iloc[0] == "sport"


def test_bbc_splits_are_disjoint_and_stratified(bbc):
    manifest, splits, _ = bbc
    ids = [set(frame["row_id"]) for frame in splits.values()]
    assert not (ids[0] & ids[1] or ids[0] & ids[2] or ids[1] & ids[2])
    assert set().union(*ids) == set(range(2124))
    class_totals = pd.concat(splits.values())["label"].value_counts()
    for split, fraction in (("validation", 0.1), ("test", 0.2)):
        counts = splits[split]["label"].value_counts()
        for label in BBC_LABELS:
            assert abs(counts[label] - fraction * class_totals[label]) <= 1, (split, label)
        assert manifest["class_counts"][split] == {label: int(counts[label]) for label in BBC_LABELS}
    assert len(splits["test"]) == 425 and len(splits["validation"]) == 212


def test_prepare_is_deterministic(bbc, tmp_path):
    _, splits, _ = bbc
    again = tmp_path / "again"
    prepare(dataset_params(name="bbc_news"), again)
    for split, frame in all_splits(again).items():
        pd.testing.assert_frame_equal(frame, splits[split])


def test_another_seed_gives_another_split(bbc, tmp_path):
    _, splits, _ = bbc
    prepare(dataset_params(split={"validation": 0.1, "test": 0.2, "seed": 14}), tmp_path / "other")
    assert set(read_split(tmp_path / "other", "test")["row_id"]) != set(splits["test"]["row_id"])


def test_unknown_builtin_lists_the_builtins(tmp_path):
    with pytest.raises(KdpipeError, match=r"builtin:imdb.*builtin:bbc_news"):
        prepare(dataset_params(source="builtin:imdb"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- local files ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_local_file_formats(tmp_path, suffix):
    source = write_table(tiny_frame(50), tmp_path / f"data{suffix}")
    manifest = prepare(dataset_params(source=source), tmp_path / "out")
    splits = all_splits(tmp_path / "out")
    assert manifest["rows"] == {"train": 35, "validation": 5, "test": 10}
    assert manifest["labels"] == ["neg", "pos"] and manifest["label_renames"] == {}
    assert list(splits["train"].columns) == ["row_id", "text", "label", "label_id"]
    everything = pd.concat(splits.values()).sort_values("row_id")
    assert everything["row_id"].tolist() == list(range(50))
    assert everything["text"].tolist() == [f"sentence number {i}" for i in range(50)]


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_text_pair_and_domain_columns(tmp_path, suffix):
    source = write_table(tiny_frame(30, pair=True, domain=True), tmp_path / f"data{suffix}")
    prepare(dataset_params(source=source, text_pair_column="hypothesis", domain_column="source"), tmp_path / "out")
    frame = read_split(tmp_path / "out", "train")
    assert list(frame.columns) == ["row_id", "text", "text_pair", "label", "label_id", "domain"]
    assert (frame["text_pair"] == "hypothesis " + frame["row_id"].astype(str)).all()
    assert set(frame["domain"]) == {"books", "dvd"}


def test_numeric_labels_become_strings(tmp_path):
    frame = tiny_frame(20)
    frame["label"] = [i % 3 for i in range(20)]
    prepare(dataset_params(source=write_table(frame, tmp_path / "data.jsonl")), tmp_path / "out")
    assert read_labels(tmp_path / "out") == ["0", "1", "2"]


def test_text_pair_is_part_of_the_duplicate_key(tmp_path):
    frame = pd.DataFrame(
        {
            "text": ["same"] * 4 + [f"t{i}" for i in range(16)],
            "pair": ["a", "b", "a", "c"] + [f"p{i}" for i in range(16)],
            "label": ["x", "y"] * 10,
        }
    )
    source = write_table(frame, tmp_path / "data.csv")
    manifest = prepare(dataset_params(source=source, text_pair_column="pair"), tmp_path / "out")
    assert manifest["duplicates_dropped"] == 1
    assert sum(manifest["rows"].values()) == 19


def test_dedup_can_be_turned_off(tmp_path):
    frame = pd.concat([tiny_frame(20), tiny_frame(20)])
    source = write_table(frame, tmp_path / "data.csv")
    assert prepare(dataset_params(source=source), tmp_path / "a")["duplicates_dropped"] == 20
    manifest = prepare(dataset_params(source=source, dedup=False), tmp_path / "b")
    assert manifest["duplicates_dropped"] == 0 and sum(manifest["rows"].values()) == 40


def test_utf8_byte_order_mark_is_not_part_of_the_header(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(b"\xef\xbb\xbf" + tiny_frame(20).to_csv(index=False).encode())
    prepare(dataset_params(source=str(path)), tmp_path / "out")
    assert read_labels(tmp_path / "out") == ["neg", "pos"]


def test_latin1_encoding_is_honoured(tmp_path):
    path = tmp_path / "data.csv"
    path.write_bytes(tiny_frame(20).assign(text=lambda f: f["text"] + " £").to_csv(index=False).encode("latin-1"))
    prepare(dataset_params(source=str(path), encoding="latin-1"), tmp_path / "out")
    assert read_split(tmp_path / "out", "train")["text"].str.endswith(" £").all()


def test_explicit_format_overrides_the_extension(tmp_path):
    path = tmp_path / "data.txt"
    tiny_frame(20).to_csv(path, sep="\t", index=False)
    manifest = prepare(dataset_params(source=str(path), format="tsv"), tmp_path / "out")
    assert sum(manifest["rows"].values()) == 20


# ---- explicit per-split files ---------------------------------------------------------------------------------


def test_explicit_train_validation_test_files(tmp_path):
    train = write_table(tiny_frame(30), tmp_path / "train.csv")
    validation = write_table(tiny_frame(6).assign(text=lambda f: "val " + f["text"]), tmp_path / "val.csv")
    test = write_table(tiny_frame(8).assign(text=lambda f: "test " + f["text"]), tmp_path / "test.jsonl")
    manifest = prepare(
        dataset_params(source=None, files={"train": train, "validation": validation, "test": test}), tmp_path / "out"
    )
    splits = all_splits(tmp_path / "out")
    assert manifest["rows"] == {"train": 30, "validation": 6, "test": 8}
    assert splits["train"]["row_id"].tolist() == list(range(30))
    assert splits["validation"]["row_id"].tolist() == list(range(30, 36))
    assert splits["test"]["row_id"].tolist() == list(range(36, 44))
    assert splits["test"]["text"].str.startswith("test ").all()
    assert "train=" in manifest["source"] and "test=" in manifest["source"]


def test_missing_validation_file_is_split_off_train(tmp_path):
    train = write_table(tiny_frame(40), tmp_path / "train.csv")
    test = write_table(tiny_frame(10).assign(text=lambda f: "test " + f["text"]), tmp_path / "test.csv")
    manifest = prepare(dataset_params(files={"train": train, "validation": None, "test": test}), tmp_path / "out")
    splits = all_splits(tmp_path / "out")
    assert manifest["rows"] == {"train": 36, "validation": 4, "test": 10}
    assert set(splits["validation"]["row_id"]) < set(range(40))
    assert splits["test"]["text"].str.startswith("test ").all()


def test_duplicates_across_files_stay_in_test(tmp_path):
    train = write_table(tiny_frame(30), tmp_path / "train.csv")
    test = write_table(tiny_frame(6), tmp_path / "test.csv")  # the first 6 train texts again
    manifest = prepare(dataset_params(files={"train": train, "test": test}), tmp_path / "out")
    splits = all_splits(tmp_path / "out")
    assert manifest["duplicates_dropped"] == 6
    assert len(splits["test"]) == 6
    train_texts = set(pd.concat([splits["train"], splits["validation"]])["text"])
    assert not train_texts & set(splits["test"]["text"])


def folded(frame: pd.DataFrame) -> pd.Series:
    from kdpipe.data.folding import fold

    return fold(frame["text"])


@pytest.mark.parametrize("dedup", [True, False])
def test_a_folded_copy_never_stays_beside_its_original_with_another_label(tmp_path, capfd, dedup):
    """prepare compares texts as the leak filters do: an upper-cased copy with another label is a conflict (both
    dropped), a copy with an entity or curly quotes and the same label a duplicate; both counted per file."""
    train = tiny_frame(30)  # "sentence number i", labels neg/pos alternating
    train.loc[len(train)] = ("SENTENCE NUMBER 0", "pos")  # row 0 is neg: a conflict
    train.loc[len(train)] = ("sentence&#32;number 1", "pos")  # row 1 is pos: a duplicate
    train.loc[len(train)] = ('he said "yes"', "neg")
    test = pd.DataFrame(
        {"text": ["He said \u201cyes\u201d", "sentence number 3", "fresh"], "label": ["neg", "neg", "neg"]}
    )
    # the first is neg in train too (a duplicate across files, kept in test); "number 3" is pos there (a conflict)
    files = {"train": write_table(train, tmp_path / "train.csv"), "test": write_table(test, tmp_path / "test.csv")}
    manifest = prepare(dataset_params(files=files, dedup=dedup), tmp_path / "out")
    conflicts = manifest["conflicting_duplicates"]
    assert conflicts["texts"] == 2 and conflicts["by_split"] == {"train": 3, "test": 1}
    assert conflicts["rows_dropped"] == 4
    splits = all_splits(tmp_path / "out")
    rows = pd.concat(splits.values(), ignore_index=True)
    keys = folded(rows)
    assert "sentence number 0" not in set(keys) and "sentence number 3" not in set(keys)
    assert rows.groupby(keys)["label"].nunique().max() == 1  # no folded text with two labels
    err = capfd.readouterr().err
    assert "2 texts appear with different labels, compared folded (drop: 4 rows dropped: 3 of train, 1 of test)" in err
    if dedup:
        assert manifest["duplicates_by_split"] == {"train": 2, "test": 0} and not keys.duplicated().any()
        assert "2 duplicate rows dropped (2 of train)" in err
        assert "He said \u201cyes\u201d" in set(splits["test"]["text"])  # the test file's copy kept
    else:
        assert manifest["duplicates_by_split"] == {} and keys.duplicated().sum() == 2


# The same input to BERT's uncased tokenizer, written differently: pre-tokenised spacing around punctuation (SST,
# the Penn Treebank), control characters (deleted by the tokenizer, vertical tab and form feed too), format characters,
# spaces around CJK ideographs; each pair's first text is the second's variant
SAME_INPUT = [
    ("the company 's plan , he said , is `` bold '' .", "The company's plan, he said, is ``bold''."),
    ("it 's a ( very ) good film -- really !", "It's a (very) good film--really!"),
    ("a\x01b c\x7fd\x0be\x0cf\x85g h\u2066i\ufffdj", "ab cdefg hij"),
    ("prices rose 5 % to $ 10", "Prices rose 5% to $10"),
    ("東京 の 会社", "東京の会社"),
    ("\u0130stanbul \u00e9t\u00e9", "istanbul ete"),
]
# ... and texts the tokenizer reads differently, which the folding keeps apart
OTHER_INPUT = [("5 \u20ac each", "5\u20ac each"), ("a \u00a9 b", "a\u00a9b"), ("ab", "a b")]


def test_texts_folded_equal_are_one_input_to_the_builtin_uncased_tokenizer():
    from kdpipe.data.folding import fold
    from kdpipe.models.loading import load_tokenizer

    tokenizer = load_tokenizer("builtin:minilm-l6")
    for pairs, same in ((SAME_INPUT, True), (OTHER_INPUT, False)):
        for variant, text in pairs:
            folded = fold(pd.Series([variant, text]))
            assert (folded[0] == folded[1]) is same, (variant, text, folded.tolist())
            ids = tokenizer([variant, text])["input_ids"]
            assert (ids[0] == ids[1]) is same, (variant, text)


def test_pre_tokenised_and_control_character_copies_are_duplicates_and_conflicts(tmp_path):
    """prepare's duplicate and conflict checks use the same folding: a pre-tokenised copy with another label is a
    conflict (every copy dropped), a copy with a control character and the same label a duplicate."""
    train = tiny_frame(30)  # "sentence number i", labels neg/pos alternating
    train.loc[len(train)] = ("The company's plan.", "neg")
    train.loc[len(train)] = ("the company 's plan .", "pos")  # a conflict
    train.loc[len(train)] = ("sentence\x01 number 2", "neg")  # row 2 is neg: a duplicate
    manifest = prepare(dataset_params(files={"train": write_table(train, tmp_path / "train.parquet")}), tmp_path / "o")
    assert manifest["conflicting_duplicates"]["texts"] == 1 and manifest["conflicting_duplicates"]["rows_dropped"] == 2
    assert manifest["duplicates_by_split"] == {"train": 1}
    rows = pd.concat(all_splits(tmp_path / "o").values(), ignore_index=True)
    assert "company" not in " ".join(rows["text"]) and not folded(rows).duplicated().any()


# ---- subsampling ----------------------------------------------------------------------------------------------


def test_max_rows_keeps_class_proportions(tmp_path):
    source = write_table(tiny_frame(400, labels=("a", "a", "a", "b")), tmp_path / "data.parquet")
    manifest = prepare(dataset_params(source=source, max_rows=100), tmp_path / "out")
    assert sum(manifest["rows"].values()) == 100
    totals = {label: sum(counts[label] for counts in manifest["class_counts"].values()) for label in "ab"}
    assert totals == {"a": 75, "b": 25}
    # row_ids are the positions in the full data, not renumbered after subsampling.
    assert max(pd.concat(all_splits(tmp_path / "out").values())["row_id"]) > 100


def test_max_per_class_caps_each_class(tmp_path):
    source = write_table(tiny_frame(400, labels=("a", "a", "a", "b")), tmp_path / "data.csv")
    manifest = prepare(dataset_params(source=source, max_per_class=50), tmp_path / "out")
    totals = {label: sum(counts[label] for counts in manifest["class_counts"].values()) for label in "ab"}
    assert totals == {"a": 50, "b": 50}


def test_small_class_keeps_a_training_row(tmp_path):
    frame = pd.concat([tiny_frame(30, labels=("a",)), pd.DataFrame({"text": ["rare"], "label": ["b"]})])
    manifest = prepare(dataset_params(source=write_table(frame, tmp_path / "data.csv")), tmp_path / "out")
    assert manifest["class_counts"]["train"]["b"] == 1


# ---- errors: nothing is left behind ---------------------------------------------------------------------------


def expect_error(params: dict, out, pattern: str) -> None:
    """prepare fails with a message matching ``pattern`` and leaves no output directory."""
    with pytest.raises(KdpipeError, match=pattern):
        prepare(params, out)
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}.tmp-*"))


def test_missing_source_file(tmp_path):
    expect_error(
        dataset_params(source=str(tmp_path / "nope.csv")),
        tmp_path / "out",
        r"nope\.csv: file not found.*dataset\.source",
    )


def test_missing_train_file(tmp_path):
    expect_error(
        dataset_params(files={"train": str(tmp_path / "train.csv")}),
        tmp_path / "out",
        r"train\.csv: file not found.*dataset\.files\.train",
    )


def test_missing_validation_file(tmp_path):
    train = write_table(tiny_frame(), tmp_path / "train.csv")
    expect_error(
        dataset_params(files={"train": train, "validation": str(tmp_path / "dev.csv")}),
        tmp_path / "out",
        r"dev\.csv: file not found.*dataset\.files\.validation",
    )


def test_zero_byte_file(tmp_path):
    (tmp_path / "data.csv").write_bytes(b"")
    expect_error(dataset_params(source=str(tmp_path / "data.csv")), tmp_path / "out", r"data\.csv: the file is empty")


def test_header_only_file(tmp_path):
    (tmp_path / "data.csv").write_text("text,label\n")
    expect_error(dataset_params(source=str(tmp_path / "data.csv")), tmp_path / "out", r"data\.csv: no data rows")


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_undecodable_file_names_the_byte_offset(tmp_path, suffix):
    path = tmp_path / f"data{suffix}"
    text = {
        ".csv": "text,label\nok,a\ncosts £5,b\n",
        ".jsonl": '{"text": "ok", "label": "a"}\n{"text": "£5", "label": "b"}\n',
    }
    path.write_bytes(text[suffix].encode("latin-1"))
    offset = text[suffix].index("£")
    expect_error(
        dataset_params(source=str(path)),
        tmp_path / "out",
        rf"data{suffix}: not valid utf-8 at byte offset {offset}.*dataset\.encoding: latin-1",
    )


def test_unknown_encoding(tmp_path):
    source = write_table(tiny_frame(), tmp_path / "data.csv")
    expect_error(dataset_params(source=source, encoding="klingon"), tmp_path / "out", r"dataset\.encoding 'klingon'")


def test_misspelt_label_column_suggests_a_match(tmp_path):
    source = write_table(tiny_frame(), tmp_path / "data.tsv")
    expect_error(
        dataset_params(source=source, label_column="lable"),
        tmp_path / "out",
        r"data\.tsv: no column 'lable' \(dataset\.label_column\); the columns are \['text', 'label'\]; "
        r"did you mean 'label'\?",
    )


def test_missing_text_pair_column_without_close_match(tmp_path):
    source = write_table(tiny_frame(), tmp_path / "data.parquet")
    with pytest.raises(KdpipeError, match=r"no column 'premise' \(dataset\.text_pair_column\)") as error:
        prepare(dataset_params(source=source, text_pair_column="premise"), tmp_path / "out")
    assert "did you mean" not in str(error.value)
    assert not (tmp_path / "out").exists()


def test_empty_label_names_the_row(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("text,label\nfine,a\nalso fine,b\nno label here,\n")
    expect_error(
        dataset_params(source=str(path)), tmp_path / "out", r"data\.csv: data row 3 .* empty label in column 'label'"
    )


def test_null_label_in_jsonl_names_the_row(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a", "label": "x"}\n{"text": "b", "label": null}\n{"text": "c", "label": "y"}\n')
    expect_error(dataset_params(source=str(path)), tmp_path / "out", r"data\.jsonl: data row 2 .* empty label")


def test_blank_text_names_the_row(tmp_path):
    path = tmp_path / "data.tsv"
    path.write_text("text\tlabel\nfine\ta\n   \tb\nok\ta\n")
    expect_error(dataset_params(source=str(path)), tmp_path / "out", r"data\.tsv: data row 2 .* empty text")


def test_unknown_extension(tmp_path):
    (tmp_path / "data.xlsx").write_bytes(b"not really")
    expect_error(
        dataset_params(source=str(tmp_path / "data.xlsx")),
        tmp_path / "out",
        r"data\.xlsx: cannot tell the format from the extension '\.xlsx'.*dataset\.format",
    )


def test_unknown_format_in_a_job_run_by_hand(tmp_path):
    """The prepare job refuses an unknown format too: a job run by hand has no schema check before it."""
    source = write_table(tiny_frame(), tmp_path / "data.csv")
    expect_error(dataset_params(source=source, format="excel"), tmp_path / "out", r"dataset\.format is 'excel'")


def test_unknown_conflicts_policy_in_a_job_run_by_hand(tmp_path):
    source = write_table(tiny_frame(), tmp_path / "data.csv")
    expect_error(
        dataset_params(source=source, conflicts="bogus"),
        tmp_path / "out",
        r"dataset\.conflicts is 'bogus'; expected one of drop, majority, error",
    )


def test_unknown_format():
    """An unknown dataset.format is refused by the config schema, in one line naming the key, before any job runs."""
    config = yaml.safe_load((REPO / "tests/configs/tiny.yaml").read_text())
    config["dataset"]["format"] = "excel"
    with pytest.raises(KdpipeError, match=r"^dataset\.format: 'excel' is not one of \['auto', 'csv', 'tsv', 'jsonl'"):
        checked_plan(config, REPO / "kdpipe/config.schema.yaml", lambda: None)


def test_corrupt_parquet(tmp_path):
    (tmp_path / "data.parquet").write_bytes(b"this is no parquet file")
    expect_error(
        dataset_params(source=str(tmp_path / "data.parquet")),
        tmp_path / "out",
        r"data\.parquet: cannot be read as parquet",
    )


def test_single_class(tmp_path):
    source = write_table(tiny_frame(labels=("only",)), tmp_path / "data.csv")
    expect_error(dataset_params(source=source), tmp_path / "out", r"data\.csv: column 'label'.*at least 2")


def test_bad_settings_name_the_key(tmp_path):
    overrides = {"split": {"validation": 0.5, "test": 0.5, "seed": 1}}
    expect_error(dataset_params(**overrides), tmp_path / "out", r"dataset\.split\.validation \+ dataset\.split\.test")


@pytest.mark.parametrize(
    ("section", "key", "message"),
    [
        ({"split": {"validation": -0.1}}, ["split", "validation"], "-0.1 is less than the minimum of 0"),
        ({"split": {"test": 1.0}}, ["split", "test"], "1.0 is greater than or equal to the maximum of 1"),
        ({"max_rows": 0}, ["max_rows"], "0 is less than the minimum of 10"),
    ],
)
def test_out_of_range_settings_are_refused_by_the_schema_naming_the_key(section, key, message):
    """A fraction outside [0, 1) or a cap below its minimum is the config schema's to refuse: the workflow checks
    every config against it before the plan (and so the prepare stage) reads a key."""
    import jsonschema
    import yaml

    from kdpipe import CONFIG_SCHEMA

    schema = yaml.safe_load(CONFIG_SCHEMA.read_text())
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors({"dataset": section}))
    assert [(list(e.path), e.message) for e in errors] == [(["dataset", *key], message)]


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"max_per_class": "10"}, r"^dataset\.max_per_class: expected an integer or null, got \"10\" \(str\)$"),
        ({"files": {"train": "a.csv", "dev": "b.csv"}}, r"^dataset\.files: unknown key 'dev'; the keys are train, "),
    ],
)
def test_settings_of_the_wrong_type_or_key_are_refused_when_read(overrides, pattern):
    """The typed settings refuse them as the slice is read (kdpipe.core.settings), one line naming the key."""
    with pytest.raises(KdpipeError, match=pattern):
        dataset_params(**overrides)


def test_failed_prepare_keeps_a_previous_artifact(tmp_path):
    source = write_table(tiny_frame(), tmp_path / "data.csv")
    out = tmp_path / "out"
    prepare(dataset_params(source=source), out)
    with pytest.raises(KdpipeError):
        prepare(dataset_params(source=source, label_column="nope"), out)
    assert read_labels(out) == ["neg", "pos"]


# ---- readers --------------------------------------------------------------------------------------------------


def test_read_split_detects_a_row_count_mismatch(tmp_path):
    out = tmp_path / "out"
    prepare(dataset_params(source=write_table(tiny_frame(), tmp_path / "data.csv")), out)
    read_split(out, "train").iloc[:-1].to_parquet(out / "train.parquet", index=False)
    with pytest.raises(ArtifactError, match=r"train\.parquet: changed since kdpipe wrote it .*--forcerun .*out"):
        read_split(out, "train")
    # an artifact from before manifests held checksums: the row count still catches it
    manifest = json.loads((out / "manifest.json").read_text())
    del manifest["checksums"]
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"train\.parquet: 27 rows but .*manifest\.json says 28"):
        read_split(out, "train")


def test_read_split_rejects_an_unknown_split(tmp_path):
    with pytest.raises(KdpipeError, match="unknown split 'dev'"):
        read_split(tmp_path, "dev")


def test_read_labels_checks_the_manifest(tmp_path):
    out = tmp_path / "out"
    prepare(dataset_params(source=write_table(tiny_frame(), tmp_path / "data.csv")), out)
    (out / "labels.json").write_text(json.dumps(["neg", "pos", "extra"]))
    with pytest.raises(ArtifactError, match="labels"):
        read_labels(out)


@pytest.mark.parametrize("rows_per_class", [1, 2])
def test_classes_too_small_to_split_are_named_not_the_fraction(tmp_path, rows_per_class):
    """50,000 one-row classes: the fraction is not too small, the classes are (each keeps its row for training)."""
    n = 50_000 if rows_per_class == 1 else 200
    frame = pd.DataFrame({"text": [f"t {i}" for i in range(n)], "label": [f"c{i // rows_per_class}" for i in range(n)]})
    source = write_table(frame, tmp_path / "d.csv")
    with pytest.raises(KdpipeError) as err:
        prepare(dataset_params(source=source, split={"validation": 0.2, "test": 0.2, "seed": 1}), tmp_path / "out")
    message = str(err.value)
    assert "too small" not in message and "no row goes to validation: each class keeps one row for training" in message
    assert (
        f"the {n // rows_per_class:,} classes of the {n:,} rows being split have at most {rows_per_class} row"
        in message
    )
    assert "give the classes more rows" in message
