"""Reading users' files faithfully: TSV as TSV, record counts, JSONL line numbers, encoding hints
(kdpipe/data/files.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import read_split
from kdpipe.data.prepare import prepare
from kdpipe.stages import finetune_teacher
from tests.conftest import TINY_TEACHER, teacher_settings
from tests.test_data import dataset_params


def tsv_lines(n=60):
    return [
        "text\tlabel",
        *(f"article {i} about {'sport' if i % 2 else 'politics'}\t{'b' if i % 2 else 'a'}" for i in range(n)),
    ]


def test_a_stray_quote_in_a_tsv_is_text(tmp_path):
    lines = tsv_lines()
    lines[5] = 'he said "the market\tb'  # an opening quote never closed: with CSV quoting it swallowed rows
    lines[9] = '"quoted" at the start\ta'
    (tmp_path / "data.tsv").write_text("\n".join(lines) + "\n")
    manifest = prepare(dataset_params(source=str(tmp_path / "data.tsv"), dedup=False), tmp_path / "out")
    assert sum(manifest["rows"].values()) == 60
    assert manifest["records"]["train"] == {
        "file": str(tmp_path / "data.tsv"),
        "format": "tsv",
        "lines": 60,
        "rows": 60,
    }
    texts = set().union(*(set(read_split(tmp_path / "out", s)["text"]) for s in ("train", "validation", "test")))
    assert 'he said "the market' in texts and '"quoted" at the start' in texts


def test_a_tab_inside_a_tsv_field_names_the_line(tmp_path):
    lines = tsv_lines()
    lines[7] = "a text\twith a tab\ta"
    (tmp_path / "data.tsv").write_text("\n".join(lines) + "\n")
    with pytest.raises(KdpipeError, match=r"data\.tsv: cannot be read as tsv .*line 8"):
        prepare(dataset_params(source=str(tmp_path / "data.tsv")), tmp_path / "out")


def test_csv_rows_spanning_lines_are_counted_and_reported(tmp_path, capfd):
    body = [f"row {i},{'a' if i % 2 else 'b'}" for i in range(40)]
    body[3] = '"a quoted text\nover two lines",a'
    (tmp_path / "data.csv").write_text("text,label\n" + "\n".join(body) + "\n")
    manifest = prepare(dataset_params(source=str(tmp_path / "data.csv")), tmp_path / "out")
    assert manifest["records"]["train"]["multiline_rows"] == 1 and manifest["records"]["train"]["rows"] == 40
    assert "1 of 40 rows span several lines" in capfd.readouterr().err


def test_a_malformed_jsonl_line_is_named_by_number(tmp_path):
    lines = [f'{{"text": "row {i}", "label": "{"ab"[i % 2]}"}}' for i in range(20)]
    lines[12] = '{"text": "broken, "label": "a"}'
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(KdpipeError, match=r"data\.jsonl: line 13 is not valid JSON"):
        prepare(dataset_params(source=str(tmp_path / "data.jsonl")), tmp_path / "out")


def test_a_utf16_file_gets_the_utf16_hint(tmp_path):
    (tmp_path / "data.csv").write_text(
        "text,label\n" + "\n".join(f"café {i},{'ab'[i % 2]}" for i in range(20)), encoding="utf-16"
    )
    with pytest.raises(KdpipeError, match=r"UTF-16 byte-order mark: set dataset\.encoding: utf-16"):
        prepare(dataset_params(source=str(tmp_path / "data.csv")), tmp_path / "out")
    manifest = prepare(dataset_params(source=str(tmp_path / "data.csv"), encoding="utf-16"), tmp_path / "out")
    assert sum(manifest["rows"].values()) == 20


def conflicting_frame():
    rows = [(f"text {i}", "ab"[i % 2]) for i in range(40)]
    rows += [("text 0", "b"), ("text 0", "b"), ("text 2", "b")]  # "text 0": a x1, b x2; "text 2": a x1, b x1
    return pd.DataFrame(rows, columns=["text", "label"])


@pytest.mark.parametrize("policy, rows, label0", [("drop", 38, None), ("majority", None, "b")])
def test_conflicting_duplicates_are_reported_and_resolved(tmp_path, capfd, policy, rows, label0):
    conflicting_frame().to_csv(tmp_path / "data.csv", index=False)
    params = dataset_params(source=str(tmp_path / "data.csv"), conflicts=policy)
    if policy == "majority":
        with pytest.raises(KdpipeError, match=r"'text 2' labelled a x1, b x1 has no majority label"):
            prepare(params, tmp_path / "out")
        frame = conflicting_frame()
        frame.loc[len(frame)] = ("text 2", "b")
        frame.to_csv(tmp_path / "data.csv", index=False)
    manifest = prepare(params, tmp_path / "out")
    found = manifest["conflicting_duplicates"]
    assert found["texts"] == 2 and found["policy"] == policy
    assert "'text 0' labelled a x1, b x2" in found["examples"][0]
    assert "2 texts appear with different labels" in capfd.readouterr().err
    texts = pd.concat(read_split(tmp_path / "out", s) for s in ("train", "validation", "test"))
    if rows is not None:
        assert len(texts) == rows and "text 0" not in set(texts["text"])
    else:
        assert texts.loc[texts["text"] == "text 0", "label"].tolist() == [label0]


def test_conflicting_duplicates_can_be_an_error(tmp_path):
    conflicting_frame().to_csv(tmp_path / "data.csv", index=False)
    with pytest.raises(KdpipeError, match=r"2 texts appear with different labels, e.g. 'text 0' labelled"):
        prepare(dataset_params(source=str(tmp_path / "data.csv"), conflicts="error"), tmp_path / "out")


def test_an_id_column_becomes_the_row_id(tmp_path):
    frame = pd.DataFrame({"doc": [1000 + 7 * i for i in range(30)], "text": [f"t {i}" for i in range(30)]})
    frame["label"] = ["ab"[i % 2] for i in range(30)]
    frame.to_csv(tmp_path / "data.csv", index=False)
    prepare(dataset_params(source=str(tmp_path / "data.csv"), id_column="doc"), tmp_path / "out")
    train = read_split(tmp_path / "out", "train")
    assert set(train["row_id"]) <= set(frame["doc"]) and "doc" not in train.columns
    assert (train["text"].str.slice(2).astype(int) * 7 + 1000 == train["row_id"]).all()
    frame.loc[3, "doc"] = 1000
    frame.to_csv(tmp_path / "data.csv", index=False)
    with pytest.raises(KdpipeError, match=r"dataset\.id_column: id 1000 is used by more than one row"):
        prepare(dataset_params(source=str(tmp_path / "data.csv"), id_column="doc"), tmp_path / "out2")


def test_a_class_too_small_for_every_split_is_reported(tmp_path, capfd):
    frame = pd.DataFrame({"text": [f"t {i}" for i in range(42)], "label": ["a"] * 20 + ["b"] * 20 + ["c"] * 2})
    frame.to_csv(tmp_path / "data.csv", index=False)
    manifest = prepare(dataset_params(source=str(tmp_path / "data.csv")), tmp_path / "out")
    absent = manifest["classes_absent"]
    assert absent and all(missing == ["c"] for missing in absent.values())
    err = capfd.readouterr().err
    for split in ("validation", "test"):
        has_c = "c" in set(read_split(tmp_path / "out", split)["label"])
        assert has_c == (split not in absent) and has_c == (f"no {split} rows of class(es) ['c']" not in err)
    if "validation" in absent:  # a teacher of that class alone cannot be validated: a clear error, not an IndexError
        with pytest.raises(
            KdpipeError, match=r"teachers\.teacher: the validation split has no rows of the teacher's classes \['c'\]"
        ):
            finetune_teacher.run(
                teacher_settings({**TINY_TEACHER, "classes": ["c"]}), tmp_path / "out", tmp_path / "teacher"
            )


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\u0085"])
@pytest.mark.parametrize("suffix", [".jsonl", ".tsv"])
def test_unicode_line_separators_inside_a_text_are_text(tmp_path, separator, suffix):
    frame = pd.DataFrame(
        {"text": [f"first{separator}second {i}" for i in range(20)], "label": ["ab"[i % 2] for i in range(20)]}
    )
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":  # written unescaped, as JSON allows; records end in "\r\n" here
        path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\r\n" for row in frame.to_dict("records")))
    else:
        frame.to_csv(path, sep="\t", index=False)
    assert separator in path.read_text(encoding="utf-8")
    manifest = prepare(dataset_params(source=str(path)), tmp_path / "out")
    assert manifest["records"]["train"]["rows"] == manifest["records"]["train"]["lines"] == 20
    texts = pd.concat(read_split(tmp_path / "out", s) for s in ("train", "validation", "test"))["text"]
    assert sorted(texts) == sorted(frame["text"])
