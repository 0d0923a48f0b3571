"""Artifacts are verified before they are trusted: a file edited or damaged after kdpipe wrote it is refused with
a message naming it and the command that rebuilds it (kdpipe/core/checksums.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from kdpipe.core.store import ArtifactError, KdpipeError
from kdpipe.data.dataset import read_split
from kdpipe.evaluation.settings import EvalSettings
from kdpipe.models.loading import load_trained
from kdpipe.signals.io import read_logits, read_mc
from kdpipe.stages import evaluate, finetune_teacher
from tests.conftest import TINY_TEACHER, model_spec, run_signal, teacher_settings

MC = {"samples": 3, "seed": 0, "batch_size": 8, "max_batch_rows": 64, "split": "train", "signal": "mc"}


@pytest.fixture(scope="module")
def made(tiny_data, tmp_path_factory):
    """A teacher and its logits and MC-dropout signals, as the workflow makes them."""
    root = tmp_path_factory.mktemp("verified")
    finetune_teacher.run(teacher_settings(), tiny_data, root / "teacher")
    run_signal("logits", {"batch_size": 8, "split": "train", "signal": "logits"}, root / "teacher", tiny_data, root)
    run_signal("mc", MC, root / "teacher", tiny_data, root)
    return root


@pytest.fixture
def copy(made, tmp_path):
    shutil.copytree(made, tmp_path / "c")
    return tmp_path / "c"


def row_ids(tiny_data):
    return read_split(tiny_data, "train")["row_id"].to_numpy()


def test_untouched_artifacts_are_read(made, tiny_data):
    logits, labels = read_logits(made / "logits.parquet", row_ids(tiny_data))
    assert logits.shape == (len(row_ids(tiny_data)), len(labels))
    assert load_trained(made / "teacher").config.num_labels == 5
    manifest = json.loads((made / "teacher/manifest.json").read_text())
    assert {"model.safetensors", "labels.json", "config.json", "tokenizer.json"} <= set(manifest["checksums"])


def test_a_hand_edited_teacher_labels_file_is_refused(copy, tiny_data, tmp_path):
    labels_file = copy / "teacher/labels.json"
    labels = json.loads(labels_file.read_text())
    labels[0], labels[1] = labels[1], labels[0]  # two classes swapped by hand
    labels_file.write_text(json.dumps(labels))
    message = r"teacher/labels\.json: changed since kdpipe wrote it .*rebuild it with: snakemake --forcerun .*teacher"
    with pytest.raises(ArtifactError, match=message):
        load_trained(copy / "teacher")
    params = {"model": "t", "base": "t", "kind": "teacher", "method": None, "seed": 0, "splits": ["test"]}
    params = EvalSettings.from_params({**params, "batch_size": 8, "ece_bins": 5})
    with pytest.raises(ArtifactError, match=message):
        evaluate.run(params, copy / "teacher", tiny_data, [tmp_path / "e.json"], [tmp_path / "e.parquet"])
    assert not (tmp_path / "e.json").exists()


def test_class_lists_that_disagree_are_refused(copy):
    """Edited consistently in labels.json and the manifest (checksum updated too), but not in the model's config."""
    folder = copy / "teacher"
    manifest = json.loads((folder / "manifest.json").read_text())
    labels = manifest["labels"][::-1]
    (folder / "labels.json").write_text(json.dumps(labels))
    del manifest["checksums"]["labels.json"]
    manifest["labels"] = labels
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"class lists disagree \(labels\.json: \['tech'.*config\.json id2label"):
        load_trained(folder)


def test_one_flipped_bit_in_the_logits_is_refused(copy, tiny_data):
    path = copy / "logits.parquet"
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"logits\.parquet: changed since kdpipe wrote it.*--forcerun .*logits"):
        read_logits(path, row_ids(tiny_data))


def test_a_truncated_mc_dump_names_the_file(copy, tiny_data):
    path = copy / "mc.npy"
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(ArtifactError, match=r"mc\.npy: changed since kdpipe wrote it"):
        read_mc(path, row_ids(tiny_data))
    manifest = json.loads((copy / "mc.json").read_text())
    del manifest["checksums"]
    (copy / "mc.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"mc\.npy: cannot be read as a \.npy array .*--forcerun .*mc\.npy"):
        read_mc(path, row_ids(tiny_data))


def test_manifests_record_a_checksum_of_each_file(made, tiny_data):
    assert set(json.loads((made / "mc.json").read_text())["checksums"]) == {"mc.npy", "mc.parquet"}
    assert set(json.loads((tiny_data / "manifest.json").read_text())["checksums"]) == {
        "train.parquet",
        "validation.parquet",
        "test.parquet",
        "labels.json",
    }
    assert np.asarray(read_mc(made / "mc.npy", row_ids(tiny_data))[0]).shape[1] == 5


def test_a_full_disk_is_refused_before_writing(made, tiny_data, tmp_path, monkeypatch):
    import collections

    import kdpipe.core.store as store

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: usage(2 << 30, 2 << 30, 40_000_000))
    with pytest.raises(KdpipeError, match=r"a resume checkpoint needs .* MB .* but only 40 MB are free"):
        finetune_teacher.run(teacher_settings({**TINY_TEACHER, "checkpoint_every": 1}), tiny_data, tmp_path / "teacher")
    with pytest.raises(KdpipeError, match=r"the logits needs .* kB .* free space"):
        run_signal(
            "logits", {"batch_size": 8, "split": "train", "signal": "logits"}, made / "teacher", tiny_data, tmp_path
        )
    assert not (tmp_path / "teacher").exists() and not (tmp_path / "logits.parquet").exists()


@pytest.mark.parametrize(
    "needed, free, kept",
    [
        (20_000_000, 84_000_000, None),  # a 0.02 GB model folder on a nearly full disk: 64 MB kept free
        (20_000_000, 80_000_000, "64 MB"),
        (500_000_000, 1_000_000_000, None),  # a 0.5 GB dump keeps as much again free
        (500_000_000, 990_000_000, "500 MB"),
        (20_000_000_000, 21_000_000_000, None),  # a 20 GB dump keeps at most 1 GB free
        (20_000_000_000, 20_999_999_999, "1 GB"),
    ],
)
def test_the_disk_reserve_grows_with_the_write(tmp_path, monkeypatch, needed, free, kept):
    import collections

    import kdpipe.core.store as store

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: usage(4 * free, 3 * free, free))
    if kept is None:
        store.ensure_disk_space(tmp_path / "out", needed, "the model folder")
        return
    with pytest.raises(KdpipeError) as err:
        store.ensure_disk_space(tmp_path / "out", needed, "the model folder", hint="free space")
    sizes = {20_000_000: "20 MB", 500_000_000: "500 MB", 20_000_000_000: "20 GB"}
    free_text = {80_000_000: "80 MB", 990_000_000: "990 MB", 20_999_999_999: "21 GB"}
    assert str(err.value) == (
        f"the model folder needs {sizes[needed]} at {tmp_path}, but only {free_text[free]} are free "
        f"(and {kept} are kept in reserve): free space"
    )


def test_a_damaged_file_linked_from_the_shared_cache_names_the_entry_to_remove(tmp_path):
    """``--forcerun`` with ``--cache`` would link the same damaged entry again: the message says to remove it."""
    from kdpipe.core.checksums import verify, write_manifest

    entry = tmp_path / "cache" / "0a1b2c"
    entry.mkdir(parents=True)
    (entry / "model.safetensors").write_bytes(b"weights")
    manifest = write_manifest(entry / "manifest.json", {"kind": "teacher"}, ["model.safetensors"])
    for linked in ("files", "folder"):  # Snakemake links each file of a fetched entry, or the stored folder itself
        target = tmp_path / linked / "results" / "teachers" / "t"
        target.parent.mkdir(parents=True)
        if linked == "files":
            target.mkdir()
            for name in ("model.safetensors", "manifest.json"):
                (target / name).symlink_to(entry / name)
        else:
            target.symlink_to(entry)
        (entry / "model.safetensors").write_bytes(b"weightz")
        with pytest.raises(ArtifactError) as err:
            verify(manifest, target / "manifest.json", ["model.safetensors"], target)
        assert f"linked from the shared cache entry {entry}" in str(err.value)
        assert f"rm -r {entry}" in str(err.value) and f"snakemake --forcerun {target}" in str(err.value)
        (entry / "model.safetensors").write_bytes(b"weights")
    plain = tmp_path / "plain"
    shutil.copytree(entry, plain)
    (plain / "model.safetensors").write_bytes(b"weightz")
    with pytest.raises(ArtifactError) as err:
        verify(manifest, plain / "manifest.json", ["model.safetensors"], plain)
    assert "shared cache" not in str(err.value) and f"snakemake --forcerun {plain}" in str(err.value)


def test_a_tiny_students_folder_is_estimated_from_its_files_and_fits_a_small_disk(tmp_path, monkeypatch):
    """The free space a model folder asks is its weights, its tokenizer's files and a little more, not 64 MB on
    top: a 4 MB student is saved on a disk with 100 MB free (64 MB of it kept in reserve)."""
    import collections

    import kdpipe.core.store as store
    from kdpipe.models.students import build_student
    from kdpipe.training.loop import FitResult, model_folder_bytes, save_trained, state_on_cpu

    tiny = {
        "tokenizer": "builtin:tiny-bert",
        "hidden_size": 32,
        "num_layers": 2,
        "num_heads": 2,
        "intermediate_size": 64,
    }
    model, tokenizer = build_student(model_spec({"config": tiny}), ["a", "b"], seed=1)
    asked = model_folder_bytes(model, tokenizer)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(store.shutil, "disk_usage", lambda _: usage(100_000_000, 0, 100_000_000))
    result = FitResult(best_state=state_on_cpu(model), best_metrics={"score": 0.5, "accuracy": 0.5}, best_epoch=1)
    manifest = {"kind": "student", "config": {"max_length": 16}, "labels": ["a", "b"], "method": "supervised"}
    save_trained(tmp_path / "s", model, tokenizer, ["a", "b"], result, manifest)
    written = sum(path.stat().st_size for path in (tmp_path / "s").rglob("*") if path.is_file())
    assert written <= asked <= written + 5_000_000  # an upper bound, and a close one
    assert asked + store.disk_reserve(asked) <= 100_000_000
