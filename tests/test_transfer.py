"""Unlabelled transfer rows (kdpipe.data.transfer; docs/your-own-models-and-data.md, "Unlabelled transfer data"):
what is dropped and counted, the row ids and draw order, every file format, bad input, the withheld training
labels of ``dataset.split.unlabelled``, the gold-label loss that skips transfer rows, and the plan's decisions."""

from __future__ import annotations

import copy
import html
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
import yaml

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import NO_LABEL, read_split
from kdpipe.data.prepare import UNLABELLED, prepare
from kdpipe.data.settings import TransferSettings
from kdpipe.data.transfer import build_transfer, transfer_rows
from kdpipe.methods.losses import gold_cross_entropy
from kdpipe.plan import Plan
from kdpipe.signals.load import RowView, join_parts
from tests.conftest import REPO, TINY_DATASET, dataset_settings

NONE_DROPPED = {
    "empty": 0,
    "duplicate": 0,
    "evaluation": 0,
    "evaluation_truncated": 0,
    "evaluation_shared": 0,
    "evaluation_contained": 0,
    "labelled": 0,
    "over_max_rows": 0,
}
SCHEMA = yaml.safe_load((REPO / "kdpipe/config.schema.yaml").read_text())


def transfer_settings(transfer, **overrides) -> TransferSettings:
    """The transfer job's settings for the tiny dataset and the transfer source(s) ``transfer`` (no ``max_length``:
    whole texts compared, as a job called by hand)."""
    keys = ("name", "text_column", "text_pair_column", "format", "encoding")
    params = {key: TINY_DATASET[key] for key in keys} | {"split": {"seed": TINY_DATASET["split"]["seed"]}}
    params |= {"transfer": transfer, "transfer_max_rows": None, "max_length": None}
    return TransferSettings.from_params(params | overrides, "transfer")


@pytest.fixture(scope="module")
def withheld_data(tmp_path_factory):
    """The tiny dataset with half of its training labels withheld."""
    out = tmp_path_factory.mktemp("withheld") / "data"
    prepare(dataset_settings({**TINY_DATASET, "split": {**TINY_DATASET["split"], "unlabelled": 0.5}}), out)
    return out


def corpus(data_dir, n=30, leaks=True) -> pd.DataFrame:
    """n new texts, then one of each kind that must be dropped (a text of the data, with its line breaks, only with
    ``leaks``)."""
    validation, train = read_split(data_dir, "validation"), read_split(data_dir, "train")
    texts = [f"an unlabelled report number {i}" for i in range(n)]
    texts += ["", "   ", texts[3]] + ([validation["text"][0], train["text"][0]] if leaks else [])
    return pd.DataFrame({"text": texts, "label": ["ignored"] * len(texts)})


def test_withheld_training_rows_lose_their_labels_and_every_class_keeps_labelled_rows(tiny_data, withheld_data):
    whole, kept = read_split(tiny_data, "train"), read_split(withheld_data, "train")
    withheld = pd.read_parquet(withheld_data / UNLABELLED)
    assert list(withheld.columns) == ["row_id", "text"]  # no label column: nothing downstream can read one
    assert len(kept) + len(withheld) == len(whole) and abs(len(withheld) - len(whole) / 2) <= 1
    assert set(kept["label"]) == set(whole["label"])
    assert set(kept["row_id"]).isdisjoint(withheld["row_id"])
    # validation and test are untouched
    for split in ("validation", "test"):
        assert read_split(withheld_data, split).equals(read_split(tiny_data, split))


def test_dropped_rows_are_counted_by_reason_and_kept_rows_are_numbered_after_the_data(tmp_path, withheld_data):
    corpus(withheld_data).to_csv(tmp_path / "extra.csv", index=False)
    manifest = build_transfer(transfer_settings(str(tmp_path / "extra.csv")), withheld_data, tmp_path / "t")
    assert manifest["dropped"] == {**NONE_DROPPED, "empty": 2, "duplicate": 1, "evaluation": 1, "labelled": 1}
    withheld = pd.read_parquet(withheld_data / UNLABELLED)
    assert manifest["rows"] == {"transfer": 30 + len(withheld)}
    rows = read_split(tmp_path / "t", "transfer")
    assert "label" not in rows and "label_id" not in rows
    # the withheld rows keep their ids, the file's rows come after every id of the dataset, in file order
    assert rows["row_id"].is_monotonic_increasing
    assert rows["row_id"][: len(withheld)].tolist() == withheld["row_id"].tolist()
    largest = max(read_split(withheld_data, s)["row_id"].max() for s in ("train", "validation", "test"))
    largest = max(largest, withheld["row_id"].max())
    assert rows["row_id"][len(withheld)] == largest + 1
    assert rows["text"][len(withheld) :].tolist() == [f"an unlabelled report number {i}" for i in range(30)]
    assert sorted(rows["draw"]) == list(range(len(rows)))


def test_every_file_format_gives_the_same_rows_and_a_cap_is_a_seeded_choice(tmp_path, tiny_data):
    frame = corpus(tiny_data, leaks=False)  # a TSV file has no quoting: no text with a line break
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_csv(tmp_path / "a.tsv", sep="\t", index=False)
    frame.to_json(tmp_path / "a.jsonl", orient="records", lines=True)
    frame.to_parquet(tmp_path / "a.parquet")
    made = {}
    for name in ("a.csv", "a.tsv", "a.jsonl", "a.parquet"):
        params = transfer_settings(str(tmp_path / name), transfer_max_rows=20)
        manifest = build_transfer(params, tiny_data, tmp_path / name.replace(".", "_"))
        assert manifest["dropped"] == {**NONE_DROPPED, "empty": 2, "duplicate": 1, "over_max_rows": 10}, name
        made[name] = read_split(tmp_path / name.replace(".", "_"), "transfer")
    for name, rows in made.items():
        pd.testing.assert_frame_equal(rows, made["a.csv"], obj=name)
    # per-part files: the parts' rows, one after the other
    both = build_transfer(
        transfer_settings([str(tmp_path / "a.csv"), str(tmp_path / "a.parquet")]), tiny_data, tmp_path / "b"
    )
    assert both["dropped"]["duplicate"] == 1 + 31  # the second part: its 30 texts and its own repeat


def test_a_smaller_share_of_transfer_rows_is_part_of_every_larger_one(tmp_path, tiny_data):
    corpus(tiny_data, n=200).to_csv(tmp_path / "extra.csv", index=False)
    build_transfer(transfer_settings(str(tmp_path / "extra.csv")), tiny_data, tmp_path / "t")
    rows = read_split(tmp_path / "t", "transfer")
    shares = {share: set(transfer_rows(rows, share)["row_id"]) for share in (0.0, 0.25, 0.5, 1.0)}
    assert [len(shares[s]) for s in shares] == [0, 50, 100, 200]
    assert shares[0.25] < shares[0.5] < shares[1.0]
    assert shares[1.0] == set(rows["row_id"])


@pytest.mark.parametrize(
    "write, expected",
    [
        (lambda p: p.write_text(""), "the file is empty"),
        (lambda p: p.write_text("  \n\n"), "the file is empty"),
        (lambda p: p.write_text("text\n"), "no data rows"),
        (lambda p: p.write_text("body,label\nsome text,a\n"), "no column 'text' (dataset.text_column)"),
        (lambda p: p.write_bytes("text\ncaf\xe9 au lait\n".encode("latin-1")), "not valid utf-8 at byte offset 8"),
        (lambda p: p.write_text('text\n""\n" "\n'), "no row is left of 2 read (2 dropped as empty text)"),
    ],
)
def test_bad_transfer_files_stop_with_one_line_naming_the_file_and_write_nothing(tmp_path, tiny_data, write, expected):
    path = tmp_path / "extra.csv"
    write(path)
    with pytest.raises(KdpipeError, match="extra.csv|dataset.transfer") as err:
        build_transfer(transfer_settings(str(path)), tiny_data, tmp_path / "t")
    assert expected in str(err.value)
    assert not (tmp_path / "t").exists()


def test_the_encoding_error_names_an_encoding_that_reads_the_file(tmp_path, tiny_data):
    path = tmp_path / "extra.csv"
    path.write_bytes("text\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(KdpipeError, match="set dataset.encoding: latin-1"):
        build_transfer(transfer_settings(str(path)), tiny_data, tmp_path / "t")
    build_transfer(transfer_settings(str(path), encoding="latin-1"), tiny_data, tmp_path / "t")
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == ["café"]


def test_the_gold_label_loss_skips_rows_without_a_label():
    logits = torch.tensor([[0.0, 0.0], [1.0, 0.0], [2.0, -1.0]])
    labels = torch.tensor([0, NO_LABEL, 1])
    # by hand: row 0 adds log 2, row 2 adds log(e^2 + e^-1) + 1 = 3.0486; averaged over the 3 rows
    expected = (math.log(2) + math.log(math.exp(2) + math.exp(-1)) + 1) / 3
    assert gold_cross_entropy(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    labelled = torch.tensor([0, 1, 1])
    assert gold_cross_entropy(logits, labelled).item() == pytest.approx(F.cross_entropy(logits, labelled).item())
    assert gold_cross_entropy(logits, torch.full((3,), NO_LABEL)).item() == 0.0


def test_signals_of_two_splits_are_joined_in_the_students_row_order():
    a, b = np.arange(24.0).reshape(4, 3, 2), 100 + np.arange(12.0).reshape(2, 3, 2)
    stacked = RowView([a, b])
    whole = np.concatenate([a, b])
    assert stacked.shape == whole.shape
    index = np.array([5, 0, 4, 2])
    assert np.array_equal(stacked[index], whole[index])
    assert np.array_equal(stacked[torch.tensor(index), 1:], whole[index, 1:])
    assert np.array_equal(stacked[3], whole[3])
    joined = join_parts(
        [
            {"logits": torch.zeros(4, 2), "labels": ["a", "b"], "hidden": a},
            {"logits": torch.ones(2, 2), "labels": ["a", "b"], "hidden": b},
        ],
        "test",
    )
    assert joined["logits"].shape == (6, 2) and joined["labels"] == ["a", "b"]
    assert isinstance(joined["hidden"], RowView) and np.array_equal(joined["hidden"][index], whole[index])
    with pytest.raises(KdpipeError, match="differ in labels"):
        join_parts([{"labels": ["a"]}, {"labels": ["b"]}], "test")


# ---- the plan


def plan_of(edit=None) -> Plan:
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "tests/configs/tiny.yaml").read_text())
    if edit:
        edit(config)
    validate(config, str(REPO / "kdpipe/config.schema.yaml"), set_default=True)
    return Plan(copy.deepcopy(config), SCHEMA)


def with_transfer(config):
    config["dataset"]["transfer"] = "extra.csv"


def test_the_transfer_slice_has_the_smallest_max_length_of_any_model():
    def shorter_student(config):
        with_transfer(config)
        name = next(iter(config["students"]))
        config["students"][name]["max_length"] = 16

    assert plan_of(with_transfer).transfer_params()["max_length"] == 32  # tests/configs/tiny.yaml's
    assert plan_of(shorter_student).transfer_params()["max_length"] == 16


def test_without_transfer_rows_no_slice_changes():
    plan = plan_of()
    assert "transfer" not in plan.prepare_params() and "unlabelled" not in plan.prepare_params()["split"]
    for student in plan.students:
        assert "transfer" not in plan.student_params(student)
        assert all("/train/" in path for path in plan.signal_files(student))


def test_methods_that_learn_from_unlabelled_rows_read_them_by_default():
    plan = plan_of(with_transfer)
    assert plan.student_transfer("s_vkd") == 1.0 and plan.student_transfer("s_muki") == 1.0
    assert plan.student_transfer("s_none") == 0.0  # supervised: gold labels alone
    assert any("/transfer/" in path for path in plan.signal_files("s_muki"))
    assert not any("/transfer/" in path for path in plan.signal_files("s_none"))
    assert plan.transfer_inputs("s_vkd") == ["results/transfer/tiny_bbc"] and plan.transfer_inputs("s_none") == []
    assert any(path.endswith("/transfer.json") for path in plan.route_files("s_muki"))
    # the transfer data is in no teacher's or dataset's slice: changing it retrains nothing
    assert "transfer" not in plan.prepare_params()
    assert plan.transfer_params()["transfer"] == "extra.csv"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["students"]["s_none"].update(transfer=0.5), "method supervised learns from no row"),
        (
            lambda c: c["students"]["s_muki"].update(transfer=1.0, method_args={"router": "oracle"}),
            "router oracle routes each row by its gold label",
        ),
        (lambda c: c["students"]["s_vkd"].update(transfer=0.5, domain="x"), "transfer rows have no domain"),
    ],
)
def test_a_share_a_student_cannot_use_stops_the_plan(edit, message):
    def both(config):
        with_transfer(config)
        edit(config)

    with pytest.raises(KdpipeError, match=message):
        plan = plan_of(both)
        for student in plan.students:
            plan.student_transfer(student)


def test_a_share_without_transfer_rows_stops_the_plan():
    plan = plan_of(lambda c: c["students"]["s_vkd"].update(transfer=0.5))
    with pytest.raises(KdpipeError, match="the dataset has no transfer rows"):
        plan.student_transfer("s_vkd")


def test_the_plan_checks_each_transfer_file_before_any_job(tmp_path):
    from kdpipe.data.transfer_sources import check_transfer_files

    def check(name):
        check_transfer_files({**TINY_DATASET, "transfer": [str(tmp_path / "ok.csv"), str(tmp_path / name)]})

    pd.DataFrame({"text": ["a"]}).to_csv(tmp_path / "ok.csv", index=False)
    pd.DataFrame({"body": ["a"]}).to_csv(tmp_path / "body.csv", index=False)
    pd.DataFrame({"body": ["a"]}).to_parquet(tmp_path / "body.parquet")
    pd.DataFrame({"body": ["a"]}).to_json(tmp_path / "body.jsonl", orient="records", lines=True)
    pd.DataFrame({"text": []}, dtype=str).to_parquet(tmp_path / "header.parquet")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "header.csv").write_text("text\n\n")
    with pytest.raises(KdpipeError, match="missing.csv: file not found.*check dataset.transfer"):
        check("missing.csv")
    with pytest.raises(KdpipeError, match="empty.csv: the file is empty"):
        check("empty.csv")
    for name in ("header.csv", "header.parquet"):
        with pytest.raises(KdpipeError, match=rf"{name}: no data rows, only a header"):
            check(name)
    for name in ("body.csv", "body.parquet", "body.jsonl"):
        with pytest.raises(
            KdpipeError, match=rf"{name}: no column 'text' \(dataset.text_column\); the columns are \['body'\]"
        ):
            check(name)
    check("ok.csv")


def test_the_plan_bounds_the_transfer_rows_from_the_files_before_reading_them(tmp_path):
    from kdpipe.data.transfer_sources import transfer_rows_bound

    frame = pd.DataFrame({"text": [f"row {i}" for i in range(7)]})
    frame.to_csv(tmp_path / "a.csv", index=False)
    frame.to_json(tmp_path / "a.jsonl", orient="records", lines=True)
    frame.to_parquet(tmp_path / "a.parquet")
    (tmp_path / "b.tsv").write_text("text\none\ntwo")  # no line break at the end
    files = [str(tmp_path / name) for name in ("a.csv", "a.jsonl", "a.parquet", "b.tsv")]
    assert transfer_rows_bound(files, "auto", None) == 7 + 7 + 7 + 2
    assert transfer_rows_bound(files, "auto", 10) == 10
    assert transfer_rows_bound(["hf:imdb"], "auto", None) is None


def test_a_saved_dataset_without_the_text_column_or_rows_stops_the_plan(tmp_path):
    from datasets import Dataset, DatasetDict

    from kdpipe.data.transfer_sources import check_transfer_files

    Dataset.from_dict({"body": ["a"]}).save_to_disk(str(tmp_path / "body"))
    DatasetDict({"a": Dataset.from_dict({"text": ["x"]}), "b": Dataset.from_dict({"body": ["y"]})}).save_to_disk(
        str(tmp_path / "mixed")
    )
    Dataset.from_dict({"text": []}).save_to_disk(str(tmp_path / "none"))
    for name, message in (("body", "no column 'text'"), ("mixed", "no column 'text'"), ("none", "has no rows")):
        with pytest.raises(KdpipeError, match=message):
            check_transfer_files({**TINY_DATASET, "transfer": str(tmp_path / name)})


def test_a_csv_text_longer_than_a_block_is_read(tmp_path, tiny_data, monkeypatch):
    import kdpipe.data.text_readers as text_readers

    monkeypatch.setattr(text_readers, "CSV_BLOCK", 1 << 10)  # (a 1 KiB block: the same as 4 MiB against a longer text)
    texts = [f"short text {i}" for i in range(30)]
    texts[20] = "long " * 2000  # 10 KB, past the first block and past 4 of them
    pd.DataFrame({"text": texts}).to_csv(tmp_path / "long.csv", index=False)
    build_transfer(transfer_settings(str(tmp_path / "long.csv")), tiny_data, tmp_path / "t")
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == texts  # each row once, in order


def test_multiline_texts_are_counted_per_file_and_not_for_the_withheld_rows(tmp_path, withheld_data, capsys):
    (tmp_path / "stray.csv").write_text('text\nfirst\n"stray quote\nthird\nfourth\n')  # a quote never closed
    (tmp_path / "clean.csv").write_text("text\none\ntwo\n")
    files = [str(tmp_path / "clean.csv"), str(tmp_path / "stray.csv")]
    manifest = build_transfer(transfer_settings(files), withheld_data, tmp_path / "t")
    assert manifest["multiline_texts"] == {files[1]: 1}  # (the withheld rows hold paragraphs: not counted)
    assert f"{files[1]}: 1 of 2 texts span several lines" in capsys.readouterr().err


def test_a_test_text_with_other_white_space_case_or_accents_is_still_dropped_as_evaluation(tmp_path, tiny_data):
    text = read_split(tiny_data, "test")["text"][0]
    variants = [text + " ", text.replace("\n", "\r\n"), "  " + text.replace("\n", "\n\n"), text.upper()]
    variants += [text.replace(" ", " \u200b", 1), text.replace("e", "\u00e9")]  # zero-width space, accents
    pd.DataFrame({"text": variants + ["a new text"]}).to_parquet(tmp_path / "near.parquet")
    manifest = build_transfer(transfer_settings(str(tmp_path / "near.parquet")), tiny_data, tmp_path / "t")
    assert manifest["dropped"]["evaluation"] == 1 and manifest["dropped"]["duplicate"] == 5
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == ["a new text"]


def test_entity_and_curly_quote_variants_of_a_test_text_are_dropped_as_evaluation(tmp_path, tiny_data):
    test = read_split(tiny_data, "test")["text"]
    quoted = test[test.str.contains("'") & test.str.contains('"')].tolist()
    variants = [
        html.escape(quoted[0]).replace("e", "&#101;", 1),  # HTML entities (&amp; &quot; &#x27; and a letter's)
        quoted[1].replace("'", "\u2019").replace('"', "\u201c"),  # curly quotes
        html.escape(quoted[2].replace("'", "\u2019")).upper(),  # both, and capitals
    ]
    assert all(variant != text for variant, text in zip(variants, quoted))
    pd.DataFrame({"text": [*variants, "a new text"]}).to_parquet(tmp_path / "near.parquet")
    manifest = build_transfer(transfer_settings(str(tmp_path / "near.parquet")), tiny_data, tmp_path / "t")
    assert manifest["dropped"]["evaluation"] == 3
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == ["a new text"]


def test_pre_tokenised_and_control_character_variants_of_a_test_text_are_dropped_as_evaluation(tmp_path, tiny_data):
    """Spaces around punctuation (a pre-tokenised corpus) and control characters change no token of an uncased
    tokenizer: such a copy of a test text is the test text."""
    test = read_split(tiny_data, "test")["text"]
    texts = test[test.str.contains(r"\w[.,']", regex=True)].tolist()
    variants = [
        " ".join(texts[0].replace(".", " . ").replace(",", " , ").replace("'", " '").split()),
        texts[1].replace(" ", " \x01", 3).replace("e", "e\x7f", 2),
    ]
    assert all(variant != text for variant, text in zip(variants, texts))
    pd.DataFrame({"text": [*variants, "a new text"]}).to_parquet(tmp_path / "near.parquet")
    manifest = build_transfer(transfer_settings(str(tmp_path / "near.parquet")), tiny_data, tmp_path / "t")
    assert manifest["dropped"]["evaluation"] == 2
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == ["a new text"]


def test_a_test_text_with_a_sentence_appended_is_the_same_model_input_and_is_dropped(tmp_path, tiny_data):
    """Cut at max_length tokens, a test text with more text after it is the test text: dropped as a copy, for the
    smallest max_length of the run's models (evaluation_truncated); a text that departs from a test text later than
    that still shares 13 consecutive words with it (evaluation_shared); a text that is only the first words of a test
    text (fewer than 13) is another input."""
    test = read_split(tiny_data, "test")["text"]
    long = test[test.str.len() > 200].iloc[0]
    texts = [long + " And one more sentence.", long[:150] + " but then something else entirely", long[:20], "new"]
    assert len(long[:20].split()) < 13 <= len(long[:150].split()) - 1
    pd.DataFrame({"text": texts}).to_parquet(tmp_path / "appended.parquet")
    source = str(tmp_path / "appended.parquet")
    manifest = build_transfer(transfer_settings(source, max_length=32), tiny_data, tmp_path / "t")
    assert manifest["copy_prefix"] == 30 and manifest["dropped"]["evaluation_truncated"] == 2
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == [long[:20], "new"]
    # a model that reads 256 tokens sees where the second text departs (after 150 characters): not the same input,
    # yet it holds 150 characters of the test text
    manifest = build_transfer(transfer_settings(source, max_length=256), tiny_data, tmp_path / "t256")
    assert manifest["copy_prefix"] == 254
    assert manifest["dropped"] == {**NONE_DROPPED, "evaluation_truncated": 1, "evaluation_shared": 1}
    assert read_split(tmp_path / "t256", "transfer")["text"].tolist() == [long[:20], "new"]
    # without a max_length (a transfer job called by hand) no prefix is compared: both are found by their words
    whole = build_transfer(transfer_settings(source), tiny_data, tmp_path / "whole")
    assert whole["copy_prefix"] is None and whole["dropped"] == {**NONE_DROPPED, "evaluation_shared": 2}


def test_a_list_object_or_bytes_is_not_taken_for_a_text(tmp_path, tiny_data):
    (tmp_path / "odd.jsonl").write_text('{"text": "fine"}\n{"text": ["a", "b"]}\n')
    with pytest.raises(KdpipeError, match=r"odd.jsonl: data row 2 .* has a list in column 'text'"):
        build_transfer(transfer_settings(str(tmp_path / "odd.jsonl")), tiny_data, tmp_path / "t")
    pd.DataFrame({"text": [b"raw bytes"]}).to_parquet(tmp_path / "odd.parquet")
    with pytest.raises(KdpipeError, match=r"has bytes \(a binary column\)"):
        build_transfer(transfer_settings(str(tmp_path / "odd.parquet")), tiny_data, tmp_path / "t")
    # a byte-order mark before the first JSON line is not part of it
    (tmp_path / "bom.jsonl").write_text('\ufeff{"text": "first"}\n{"text": "second"}\n')
    build_transfer(transfer_settings(str(tmp_path / "bom.jsonl")), tiny_data, tmp_path / "t")
    assert read_split(tmp_path / "t", "transfer")["text"].tolist() == ["first", "second"]


def test_a_file_changed_between_the_two_reads_stops_the_job(tmp_path, tiny_data, monkeypatch):
    import kdpipe.data.transfer as transfer

    path = tmp_path / "moving.csv"
    pd.DataFrame({"text": ["one", "two"]}).to_csv(path, index=False)
    calls = []
    original = transfer.folded_hashes

    def hashes_then_edit(folded, prefix=None):  # the file is rewritten right after pass 1 has hashed it
        calls.append(1)
        if len(calls) == 3:  # the evaluation splits (2), then the file in pass 1
            pd.DataFrame({"text": [read_split(tiny_data, "test")["text"][0], "two"]}).to_csv(path, index=False)
        return original(folded, prefix)

    monkeypatch.setattr(transfer, "folded_hashes", hashes_then_edit)
    with pytest.raises(KdpipeError, match="changed while the transfer job read it"):
        build_transfer(transfer_settings(str(path)), tiny_data, tmp_path / "t")
    assert not (tmp_path / "t").exists()


def test_the_transfer_curve_never_averages_two_kinds_of_student(tmp_path):
    from kdpipe.report.transfer import _lines, plot_transfer

    runs = pd.DataFrame(
        [
            {"kind": "student", "split": "test", "method": m, "base": b, "transfer_rows": n, "accuracy": a}
            for m, b, n, a in [
                ("vanilla_kd", "vkd_t0", 0, 0.7),
                ("vanilla_kd", "vkd_t100", 100, 0.8),
                ("muki", "muki_t0", 0, 0.8),
                ("muki", "muki_t100", 100, 0.9),
                ("muki", "muki_hot_t100", 100, 0.6),  # another setting at the same size: lines of its own
                ("supervised", "supervised", 0, 0.85),
            ]
        ]
    )
    labels = [label for label, _ in _lines(runs[runs["method"] != "supervised"])]
    assert labels == ["vanilla_kd", "muki_t0 (muki)", "muki_t100 (muki)", "muki_hot_t100 (muki)"]
    plot_transfer(runs, "test", tmp_path / "transfer.png")
    assert (tmp_path / "transfer.png").stat().st_size > 10_000
    # every share came to 0 rows: the declared figure is still written, saying so
    plot_transfer(runs.assign(transfer_rows=0), "test", tmp_path / "empty.png")
    assert (tmp_path / "empty.png").is_file()


def test_reading_a_parquet_transfer_file_holds_memory_flat_in_its_length(tmp_path, monkeypatch):
    """Arrow's Parquet reader pre-buffers by default and keeps what it buffered until the read ends: reading a file
    of a million transfer rows then held the whole file's compressed bytes. The readers turn that off: the most
    memory Arrow holds while reading a file four times longer is the same (a 440 MB file of a million rows grew a
    transfer job by about 350 MB before)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    import kdpipe.data.text_readers as text_readers

    monkeypatch.setattr(text_readers, "BATCH_ROWS", 1000)
    rng = np.random.default_rng(0)

    def most_held(groups: int) -> tuple[int, int]:
        path = tmp_path / f"{groups}.parquet"
        with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
            for _ in range(groups):  # row groups of 2,000 texts of 60 random numbers (about 0.7 MB compressed)
                texts = [" ".join(map(str, rng.integers(0, 10**6, 60))) for _ in range(2000)]
                writer.write_table(pa.table({"text": texts}))
        start, most = pa.total_allocated_bytes(), 0
        source = SimpleNamespace(text_column="text", text_pair_column=None, format="auto", encoding="utf-8")
        ((_, reader),) = text_readers.text_readers(str(path), "dataset.transfer", source)
        for _ in reader():
            most = max(most, pa.total_allocated_bytes() - start)
        return most, path.stat().st_size

    (short, _), (long, size) = most_held(4), most_held(16)
    assert long < 1.2 * short and long < size / 2
