"""Labels as the prepare stage checks them (kdpipe/data/labels.py, kdpipe/data/prepare.py): every class has
training rows, one class written differently stops the run or is merged (dataset.normalize_labels), labels are
single values, the label order depends on the labels only, and splits that cannot work stop the plan."""

from __future__ import annotations

import json

import datasets
import numpy as np
import pandas as pd
import pytest

from kdpipe.core.store import KdpipeError, read_json
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.data.labels import number_text
from kdpipe.data.labelspace import resolve_classes
from kdpipe.data.prepare import dataset_labels, prepare
from kdpipe.data.settings import ClassSlice
from tests.test_data import dataset_params, expect_error, tiny_frame, write_table

# ---- every class has training rows ----------------------------------------------------------------------------


def files_with_extra_test_class(tmp_path, where="test"):
    train = write_table(tiny_frame(30), tmp_path / "train.csv")
    other = tiny_frame(9, labels=("neg", "pos", "weather")).assign(text=lambda f: f"{where} " + f["text"])
    return {"train": train, where: write_table(other, tmp_path / f"{where}.csv")}


@pytest.mark.parametrize("where", ["test", "validation"])
def test_a_class_with_no_training_row_stops_the_plan(tmp_path, where):
    files = files_with_extra_test_class(tmp_path, where)
    message = (
        rf"{where}\.csv \(dataset\.files\.{where}\): class 'weather' has no row in the training data "
        r"\(.*train\.csv\); every class needs training rows: add some, or drop its rows"
    )
    expect_error(dataset_params(files=files), tmp_path / "out", message)
    with pytest.raises(KdpipeError, match=message):  # what the plan reads when it builds the DAG
        dataset_labels(dataset_params(files=files))


def test_a_class_whose_training_rows_are_duplicates_says_so(tmp_path):
    train = tiny_frame(20)
    others = tiny_frame(4, labels=("neg",)).assign(text=lambda f: "other " + f["text"])
    test = pd.concat([train[train["label"] == "pos"], others])
    files = {"train": write_table(train, tmp_path / "train.csv"), "test": write_table(test, tmp_path / "test.csv")}
    expect_error(
        dataset_params(files=files),
        tmp_path / "out",
        r"class 'pos' has no row in the training data \(.*train\.csv\): its training rows all repeat texts of the "
        r"evaluation data, where they are kept \(dataset\.dedup\)",
    )
    manifest = prepare(dataset_params(files=files, dedup=False), tmp_path / "out")
    assert manifest["class_counts"]["train"]["pos"] + manifest["class_counts"]["validation"]["pos"] == 10


def test_a_class_only_in_a_hugging_face_test_split_stops_the_run(tmp_path):
    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )
    train = datasets.Dataset.from_dict(
        {"text": [f"t {i}" for i in range(30)], "label": [i % 2 for i in range(30)]}, features=features
    )
    test = datasets.Dataset.from_dict(
        {"text": [f"x {i}" for i in range(9)], "label": [i % 3 for i in range(9)]}, features=features
    )
    datasets.DatasetDict({"train": train, "test": test}).save_to_disk(str(tmp_path / "hf"))
    expect_error(
        dataset_params(source=str(tmp_path / "hf")),
        tmp_path / "out",
        r"hf \(test split\): class 'c' has no row in the training data \(.*hf \(train split\)\)",
    )


# ---- one class written differently ----------------------------------------------------------------------------


def labelled(labels, n=40) -> pd.DataFrame:
    return tiny_frame(n, labels=tuple(labels))


@pytest.mark.parametrize(
    ("labels", "group"),
    [
        (("sport", "Sport", "sport ", "politics"), r"'Sport' \(10 rows\), 'sport' \(10 rows\), 'sport ' \(10 rows\)"),
        (("1", "1.0", "01", "2"), r"'01' \(10 rows\), '1' \(10 rows\), '1.0' \(10 rows\)"),
    ],
)
def test_labels_written_differently_stop_the_run(tmp_path, labels, group):
    source = write_table(labelled(labels), tmp_path / "data.csv")
    expect_error(
        dataset_params(source=source),
        tmp_path / "out",
        r"data\.csv: column 'label' \(dataset\.label_column\) has labels that are one class written differently "
        rf"\(equal after trimming spaces, ignoring case, or as numbers\): {group}; set dataset\.normalize_labels: true",
    )


def test_every_clashing_group_is_listed(tmp_path):
    source = write_table(labelled(("a", "A", "b", "B ", "c"), n=50), tmp_path / "data.csv")
    with pytest.raises(KdpipeError) as error:
        prepare(dataset_params(source=source), tmp_path / "out")
    assert "'A' (10 rows), 'a' (10 rows); 'B ' (10 rows), 'b' (10 rows)" in str(error.value)


def test_normalize_labels_merges_them(tmp_path, capfd):
    frame = labelled(("sport", "Sport", "sport", " politics", "politics", "1.0", "01", "1", "1"), n=90)
    source = write_table(frame, tmp_path / "data.csv")
    manifest = prepare(dataset_params(source=source, normalize_labels=True), tmp_path / "out")
    assert manifest["labels"] == ["1", "politics", "sport"]
    assert manifest["label_merges"] == {
        "1": {"01": 10, "1": 20, "1.0": 10},
        "politics": {" politics": 10, "politics": 10},
        "sport": {"Sport": 10, "sport": 20},
    }
    every = pd.concat(read_split(tmp_path / "out", s) for s in ("train", "validation", "test"))
    assert every["label"].value_counts().to_dict() == {"1": 40, "sport": 30, "politics": 20}
    err = capfd.readouterr().err
    assert "dataset.normalize_labels: merged ' politics' (10 rows) -> 'politics' (20 rows in all); " in err
    assert "'Sport' (10 rows) -> 'sport' (30 rows in all)" in err
    assert "'01' (10 rows), '1.0' (10 rows) -> '1' (40 rows in all)" in err


def test_a_case_tie_takes_the_first_spelling_in_sorted_order(tmp_path):
    source = write_table(labelled(("sport", "Sport", "tech", "Tech", "tech")), tmp_path / "data.csv")
    manifest = prepare(dataset_params(source=source, normalize_labels=True), tmp_path / "out")
    assert manifest["labels"] == ["Sport", "tech"]  # 'Sport' < 'sport' (a tie); 'tech' is the most frequent


def test_normalize_labels_records_nothing_merged_and_leaves_the_slice_unchanged_when_off(tmp_path):
    source = write_table(tiny_frame(), tmp_path / "data.csv")
    assert prepare(dataset_params(source=source, normalize_labels=True), tmp_path / "a")["label_merges"] == {}
    assert "label_merges" not in prepare(dataset_params(source=source), tmp_path / "b")

    from tests.test_plan import load

    assert "normalize_labels" not in load().prepare_params()  # an existing dataset stays cached
    on = load(edit=lambda config: config["dataset"].update(normalize_labels=True)).prepare_params()
    assert on["normalize_labels"] is True


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("1", "1"), ("1.0", "1"), ("01", "1"), ("+1", "1"), ("1e0", "1"), ("-0.0", "0"), ("0.50", "0.5"),
     (".5", "0.5"), ("2.5e1", "25"), ("sport", None), ("nan", None), ("1,0", None), ("1e400", None)],
)  # fmt: skip
def test_number_text(text, canonical):
    assert number_text(text) == canonical


def test_json_numbers_equal_as_numbers_stop_unless_merged(tmp_path):
    rows = [{"text": f"row {i}", "label": [1, 1.0, "1", 2, 2.0, 0.5][i % 6]} for i in range(36)]
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    source = str(tmp_path / "data.jsonl")
    with pytest.raises(KdpipeError, match=r"'1' \(12 rows\), '1\.0' \(6 rows\); '2' \(6 rows\), '2\.0' \(6 rows\)"):
        prepare(dataset_params(source=source), tmp_path / "out")
    manifest = prepare(dataset_params(source=source, normalize_labels=True), tmp_path / "out")
    assert manifest["labels"] == ["0.5", "1", "2"]
    assert sum(manifest["class_counts"][s]["1"] for s in ("train", "validation", "test")) == 18


def test_a_parquet_float_label_column_of_whole_numbers_gives_integer_labels(tmp_path):
    frame = tiny_frame(30).assign(label=[float(i % 3) for i in range(30)])
    prepare(dataset_params(source=write_table(frame, tmp_path / "data.parquet")), tmp_path / "out")
    assert read_labels(tmp_path / "out") == ["0", "1", "2"]


# ---- single values --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "column", "key", "message"),
    [
        ({3: ["a", "b"]}, "label", "label_column", r"data row 4 \(counting from 1\) has a list in column 'label' "
         r"\(dataset\.label_column\); labels must be single values"),
        ({0: {"x": 1}}, "label", "label_column", r"data row 1 .* has an object in column 'label'"),
        ({5: ["t"]}, "text", "text_column", r"data row 6 .* has a list in column 'text' .*; texts must be single"),
        ({2: {"name": "d"}}, "source", "domain_column", r"an object in column 'source' \(dataset\.domain_column\); "
         r"domains must be single values"),
        ({7: [7]}, "doc", "id_column", r"data row 8 .* a list in column 'doc' \(dataset\.id_column\); ids must"),
    ],
)  # fmt: skip
def test_a_list_or_object_in_a_jsonl_column_is_refused(tmp_path, values, column, key, message):
    rows = [{"text": f"t {i}", "label": "ab"[i % 2], "source": "books", "doc": i} for i in range(20)]
    for row, value in values.items():
        rows[row][column] = value
    (tmp_path / "data.jsonl").write_text("\n".join(json.dumps(row) for row in rows))
    params = {key: column} if key != "text_column" and key != "label_column" else {}
    expect_error(dataset_params(source=str(tmp_path / "data.jsonl"), **params), tmp_path / "out", message)


def test_a_parquet_list_or_struct_column_is_refused(tmp_path):
    frame = tiny_frame(20)
    frame["label"] = [[1, 2]] * 20
    path = write_table(frame, tmp_path / "lists.parquet")
    expect_error(
        dataset_params(source=path),
        tmp_path / "out",
        r"lists\.parquet: data row 1 \(counting from 1\) has a list in column 'label' \(dataset\.label_column\) "
        r"\(and 19 more rows\); labels must be single values",
    )
    frame = tiny_frame(20).assign(text=[{"title": f"t {i}"} for i in range(20)])
    path = write_table(frame, tmp_path / "structs.parquet")
    expect_error(dataset_params(source=path), tmp_path / "out", r"structs\.parquet: .* an object in column 'text'")


# ---- label order ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("labels", [("tech", "Business", "sport", "a|b"), ("10", "2", "-1", "0")])
def test_the_label_order_depends_on_the_labels_only(tmp_path, labels):
    frame = tiny_frame(48, labels=labels)
    orders = []
    for seed in range(4):
        shuffled = frame.sample(frac=1, random_state=seed).reset_index(drop=True)
        train, test = shuffled.iloc[:36], shuffled.iloc[36:]
        files = {"train": write_table(train, tmp_path / f"train{seed}.csv")}
        files["test"] = write_table(test, tmp_path / f"test{seed}.jsonl")
        orders.append(dataset_labels(dataset_params(files=files)))
        orders.append(dataset_labels(dataset_params(source=write_table(shuffled, tmp_path / f"all{seed}.parquet"))))
    # a label first seen in the test file, then only later in train
    first = frame.sort_values("label", key=lambda s: s == labels[-1], ascending=False, kind="stable")
    files = {
        "train": write_table(first.iloc[4:], tmp_path / "late.csv"),
        "test": write_table(first.iloc[:4], tmp_path / "early.csv"),
    }
    orders.append(dataset_labels(dataset_params(files=files)))
    expected = sorted(labels, key=int) if all(label.lstrip("-").isdigit() for label in labels) else sorted(labels)
    assert orders == [expected] * len(orders)


# ---- splits that cannot work ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ({"validation": 0, "test": 0.2}, r"dataset\.split\.validation is 0: kdpipe validates every teacher and "
         r"student on validation rows after each epoch .*; give a fraction > 0 or a validation file "
         r"\(dataset\.files\.validation\)"),
        ({"validation": 0.1, "test": 0}, r"dataset\.split\.test is 0: kdpipe evaluates every model on test rows; "
         r"give a fraction > 0 or a test file \(dataset\.files\.test\)"),
        ({"validation": 0.01, "test": 0.2}, r"dataset\.split\.validation is 0\.01, too small for the 40 rows being "
         r"split: no row goes to validation"),
    ],
)  # fmt: skip
def test_an_empty_validation_or_test_split_stops_the_plan(tmp_path, split, message):
    params = dataset_params(source=write_table(tiny_frame(), tmp_path / "data.csv"), split={**split, "seed": 1})
    expect_error(params, tmp_path / "out", message)
    with pytest.raises(KdpipeError, match=message):
        dataset_labels(params)


def test_a_zero_fraction_is_fine_where_a_file_gives_the_split(tmp_path):
    files = {
        "train": write_table(tiny_frame(), tmp_path / "train.csv"),
        "test": write_table(tiny_frame(10).assign(text=lambda f: "test " + f["text"]), tmp_path / "test.csv"),
    }
    manifest = prepare(dataset_params(files=files, split={"validation": 0.1, "test": 0, "seed": 1}), tmp_path / "o")
    assert manifest["rows"]["test"] == 10 and manifest["rows"]["validation"] == 4


def test_a_split_of_zero_stops_a_dry_run_before_any_job():
    from tests.test_plan import load

    def no_test(config):
        config["dataset"]["split"]["test"] = 0

    with pytest.raises(KdpipeError, match=r"dataset\.split\.test is 0: kdpipe evaluates every model on test rows"):
        load(edit=no_test)


def test_an_id_beyond_64_bits_names_the_row(tmp_path):
    ids = [str(1000 + i) for i in range(20)]
    ids[4] = str(10**20)
    (tmp_path / "data.csv").write_text(
        "doc,text,label\n" + "\n".join(f"{doc},t {i},{'ab'[i % 2]}" for i, doc in enumerate(ids)) + "\n"
    )
    expect_error(
        dataset_params(source=str(tmp_path / "data.csv"), id_column="doc"),
        tmp_path / "out",
        r"data\.csv: data row 5 \(counting from 1\) has id 100000000000000000000 \(dataset\.id_column\), outside "
        r"the 64-bit integer range -9223372036854775808 to 9223372036854775807",
    )
    ids[4] = str(np.iinfo(np.int64).max)
    (tmp_path / "data.csv").write_text(
        "doc,text,label\n" + "\n".join(f"{doc},t {i},{'ab'[i % 2]}" for i, doc in enumerate(ids)) + "\n"
    )
    prepare(dataset_params(source=str(tmp_path / "data.csv"), id_column="doc"), tmp_path / "out")
    every = pd.concat(read_split(tmp_path / "out", s) for s in ("train", "validation", "test"))
    assert np.iinfo(np.int64).max in set(every["row_id"])
    assert read_json(tmp_path / "out" / "manifest.json")["rows"]["train"] == 14


def test_a_muki_slice_is_a_contiguous_block_of_the_label_order_the_last_one_to_the_end():
    labels = list("abcdefg")  # 7 labels in 3 slices of 7 // 3 = 2: the last one takes the remaining 3
    slices = [resolve_classes(ClassSlice(slice=k, of=3), labels, "teachers.t") for k in range(3)]
    assert slices == [["a", "b"], ["c", "d"], ["e", "f", "g"]]
    with pytest.raises(KdpipeError, match=r"classes slice 3 of 3: need 0 <= slice < of <= number of classes \(7\)"):
        resolve_classes(ClassSlice(slice=3, of=3), labels, "teachers.t")
    with pytest.raises(KdpipeError, match=r"classes slice 0 of 8"):
        resolve_classes(ClassSlice(slice=0, of=8), labels, "teachers.t")
