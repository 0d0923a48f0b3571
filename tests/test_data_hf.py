"""Label order and Hugging Face ``datasets`` sources of the prepare stage (kdpipe/data/hf.py)."""

from __future__ import annotations

import datasets
import pytest

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.data.prepare import prepare
from tests.test_data import dataset_params, tiny_frame, write_table

NAMES = ["world", "sports", "business", "scitech"]  # declared order, not alphabetical


def test_integer_labels_are_ordered_numerically(tmp_path):
    frame = tiny_frame(120)
    frame["label"] = [i % 12 for i in range(120)]
    prepare(dataset_params(source=write_table(frame, tmp_path / "data.csv")), tmp_path / "out")
    assert read_labels(tmp_path / "out") == [str(i) for i in range(12)]
    train = read_split(tmp_path / "out", "train")
    assert (train["label_id"] == train["label"].astype(int)).all()


def test_mixed_labels_are_sorted_as_text(tmp_path):
    frame = tiny_frame(30, labels=("10", "9", "x"))
    prepare(dataset_params(source=write_table(frame, tmp_path / "data.csv")), tmp_path / "out")
    assert read_labels(tmp_path / "out") == ["10", "9", "x"]


def class_label_dataset(n: int, *, label_all: int | None = None) -> datasets.Dataset:
    features = datasets.Features({"text": datasets.Value("string"), "label": datasets.ClassLabel(names=NAMES)})
    labels = [label_all if label_all is not None else i % 4 for i in range(n)]
    return datasets.Dataset.from_dict(
        {"text": [f"article {i} {n}" for i in range(n)], "label": labels},
        features=features if label_all is None else None,
    )


def test_save_to_disk_folder_keeps_its_splits_and_class_names(tmp_path):
    folder = tmp_path / "hfdata"
    datasets.DatasetDict(
        {"train": class_label_dataset(80), "validation": class_label_dataset(20), "test": class_label_dataset(24)}
    ).save_to_disk(str(folder))
    manifest = prepare(dataset_params(source=str(folder)), tmp_path / "out")
    assert read_labels(tmp_path / "out") == NAMES  # the ClassLabel's order
    assert manifest["rows"] == {"train": 80, "validation": 20, "test": 24}
    test = read_split(tmp_path / "out", "test")
    assert test["text"].str.endswith(" 24").all()  # the given test split, not one split off train
    assert test.loc[test["text"] == "article 1 24", "label"].item() == "sports"
    assert (test["label"].map(NAMES.index) == test["label_id"]).all()


def test_unlabelled_test_split_is_replaced_by_one_split_off_train(tmp_path, capfd):
    folder = tmp_path / "hfdata"
    datasets.DatasetDict(
        {"train": class_label_dataset(100), "test": class_label_dataset(10, label_all=-1)}
    ).save_to_disk(str(folder))
    manifest = prepare(dataset_params(source=str(folder)), tmp_path / "out")
    assert "split 'test' has no labels" in capfd.readouterr().err
    assert manifest["rows"] == {"train": 70, "validation": 10, "test": 20}


def test_hub_name_and_config_go_to_load_dataset(tmp_path, monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None):
        calls.append((name, config))
        return datasets.DatasetDict({"train": class_label_dataset(60), "dev": class_label_dataset(12)})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    manifest = prepare(dataset_params(source="hf:some/news:large"), tmp_path / "out")
    assert calls == [("some/news", "large")]
    assert manifest["rows"]["validation"] == 12  # "dev" is the validation split
    assert manifest["source"] == "hf:some/news:large"


def test_unreachable_hub_dataset_is_a_clear_error(tmp_path, monkeypatch):
    def offline(name, config=None):
        raise ConnectionError("Couldn't reach the hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(KdpipeError, match=r"hf:nobody/nothing: cannot be loaded .*network or a copy in the local"):
        prepare(dataset_params(source="hf:nobody/nothing"), tmp_path / "out")


def test_missing_label_column_names_the_columns(tmp_path):
    folder = tmp_path / "hfdata"
    datasets.Dataset.from_dict({"sentence": ["a", "b"], "y": [0, 1]}).save_to_disk(str(folder))
    with pytest.raises(KdpipeError, match=r"no column 'label' \(dataset.label_column\); its columns are"):
        prepare(dataset_params(source=str(folder)), tmp_path / "out")


def test_hf_splits_test_on_the_labelled_validation_split(tmp_path):
    # GLUE's way: test labels hidden, so test on the labelled validation split and split validation off train
    folder = tmp_path / "hfdata"
    datasets.DatasetDict(
        {
            "train": class_label_dataset(80),
            "validation": class_label_dataset(24),
            "test": class_label_dataset(30, label_all=-1),
        }
    ).save_to_disk(str(folder))
    params = dataset_params(source=str(folder), hf_splits={"test": "validation", "validation": None})
    manifest = prepare(params, tmp_path / "out")
    assert manifest["rows"]["test"] == 24
    assert read_split(tmp_path / "out", "test")["text"].str.endswith(" 24").all()
    validation = read_split(tmp_path / "out", "validation")
    assert validation["text"].str.endswith(" 80").all()  # split off train
    assert manifest["rows"]["train"] + manifest["rows"]["validation"] == 80


def test_hf_splits_names_a_missing_split(tmp_path):
    folder = tmp_path / "hfdata"
    datasets.DatasetDict({"train": class_label_dataset(40)}).save_to_disk(str(folder))
    with pytest.raises(KdpipeError, match=r"dataset.hf_splits.test: .* has no split 'dev'; its splits are \['train'\]"):
        prepare(dataset_params(source=str(folder), hf_splits={"test": "dev"}), tmp_path / "out")
