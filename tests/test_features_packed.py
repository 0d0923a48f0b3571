"""Token-level dumps stored without padding (docs/design.md, "Feature dumps and their size"): the layout by hand, the
checked reader, and what the methods get: the same padded batches, and so the same losses, as from the dense layout
kdpipe wrote before (each row padded to the split's longest)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kdpipe.core.store import ArtifactError
from kdpipe.data.batching import collate, model_inputs, training_batches
from kdpipe.data.dataset import read_split
from kdpipe.methods import dfa, dynamic_kd
from kdpipe.methods.base import DistillContext
from kdpipe.methods.meta_kd import student as meta_kd
from kdpipe.methods.registry import get_method
from kdpipe.models.inference import iterate
from kdpipe.models.loading import load_classifier
from kdpipe.signals.features import selected_states
from kdpipe.signals.io import read_features
from kdpipe.signals.load import TokenFeature, load_signals, subset_signals
from kdpipe.signals.online import online_signals
from kdpipe.signals.packed import offsets_of, pack_rows, row_counts
from kdpipe.signals.teacher import open_teacher
from kdpipe.stages.finetune_teacher import run as finetune_teacher
from tests.conftest import method_args, run_signal, teacher_settings

CPU = torch.device("cpu")
LAYERS = {"hidden": [0, 1, 2], "attentions": [1, 2], "attentions_mean": [1, 2]}


# ---- the layout, by hand ----------------------------------------------------------------------------------------


def test_row_sizes_and_offsets_by_hand():
    lengths = np.array([3, 1, 2])
    assert row_counts("hidden", lengths, 2, 4).tolist() == [3, 1, 2]  # tokens, each [L_sel, H]
    assert row_counts("attentions", lengths, 2, 4).tolist() == [72, 8, 32]  # 2 layers x 4 heads x len²
    assert row_counts("attentions_mean", lengths, 2, 4).tolist() == [18, 2, 8]  # 2 layers x len²
    assert offsets_of(np.array([72, 8, 32])).tolist() == [0, 72, 80, 112]


def pack_dense(feature: str, dense: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A dense dump (the older layout, padded to one width) as (data, offsets) of the packed layout."""
    rows = pack_rows(feature, np.asarray(dense), lengths)
    shape = (0, dense.shape[1], dense.shape[-1]) if feature == "hidden" else (0,)
    data = np.concatenate(rows) if rows else np.zeros(shape, dtype=dense.dtype)
    return data, offsets_of(np.array([len(r) for r in rows], dtype=np.int64))


def _dense(shape: tuple[int, ...], lengths: np.ndarray, square: bool) -> np.ndarray:
    """Distinct values, zero past each row's length (as a dense dump held them)."""
    dense = np.arange(1, np.prod(shape) + 1, dtype=np.float32).reshape(shape)
    for i, n in enumerate(lengths):
        dense[i, ..., n:, :] = 0
        if square:
            dense[i, ..., :, n:] = 0
    return dense.astype(np.float16)


def test_hidden_states_pack_and_pad_back_by_hand():
    lengths = np.array([3, 1, 2])
    dense = _dense((3, 2, 4, 2), lengths, square=False)  # 3 rows, 2 layers, width 4, H = 2
    data, offsets = pack_dense("hidden", dense, lengths)
    assert data.shape == (6, 2, 2) and offsets.tolist() == [0, 3, 4, 6]
    np.testing.assert_array_equal(data[3], dense[1, :, 0])  # row 1's one token, both layers
    view = TokenFeature.packed("hidden", data, lengths, [0, 5], hidden_size=2, heads=4)
    np.testing.assert_array_equal(view.rows(np.array([2, 0]), 1, 3), dense[[2, 0], 1, :3])
    np.testing.assert_array_equal(view.rows(np.array([1]), 0, 1), dense[[1], 0, :1])
    assert view.rows(np.array([0]), 0, 5).shape == (1, 5, 2)  # wider than the dump: zeros


@pytest.mark.parametrize("feature, inner", [("attentions", (2,)), ("attentions_mean", ())])
def test_attentions_pack_and_pad_back_by_hand(feature, inner):
    lengths = np.array([2, 3])
    dense = _dense((2, 2, *inner, 3, 3), lengths, square=True)
    data, offsets = pack_dense(feature, dense, lengths)
    per_layer = int(np.prod(inner, dtype=int))
    assert offsets.tolist() == [0, 2 * per_layer * 4, 2 * per_layer * (4 + 9)]
    np.testing.assert_array_equal(data[: offsets[1]], dense[0, ..., :2, :2].reshape(-1))
    view = TokenFeature.packed(feature, data, lengths, [3, 6], hidden_size=8, heads=2)
    for slot in (0, 1):
        np.testing.assert_array_equal(view.rows(np.array([1, 0]), slot, 3), dense[[1, 0], slot])
        np.testing.assert_array_equal(view.rows(np.array([0]), slot, 2), dense[[0], slot, ..., :2, :2])


def test_views_concatenate_and_subset_without_copies():
    first = TokenFeature.packed("hidden", np.ones((3, 1, 2), np.float16), np.array([1, 2]), [0], hidden_size=2, heads=1)
    second = TokenFeature.packed(
        "hidden", np.full((2, 1, 2), 2, np.float16), np.array([2]), [0], hidden_size=2, heads=1
    )
    both = TokenFeature.concat([first, second]).subset(np.array([2, 0]))
    assert both.lengths.tolist() == [2, 1] and both.arrays[1] is second.arrays[0]
    assert both.rows(np.array([0, 1]), 0, 2)[..., 0].tolist() == [[2, 2], [1, 0]]


# ---- dumps written by the pass, read back ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def teacher(tiny_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("teacher") / "t"
    finetune_teacher(teacher_settings(), tiny_data, out)
    return out


@pytest.fixture(scope="module")
def dumps(teacher, tiny_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("signals") / "t" / "train"
    run_signal("logits", {"batch_size": 4, "split": "train", "signal": "logits"}, teacher, tiny_data, out)
    for feature, layers in LAYERS.items():
        run_signal(
            feature, {"batch_size": 4, "split": "train", "signal": feature, "layers": layers}, teacher, tiny_data, out
        )
    return out


@torch.inference_mode()
def dense_dump(model, encoded, feature: str, layers: list[int], batch_size: int = 4) -> np.ndarray:
    """The dump as kdpipe wrote it before (kdpipe/signals/features.py until this layout): [N, L_sel, S, H] or
    [N, L_sel, (heads,) S, S] with S the split's longest row, zero past each row's length."""
    width = int(encoded.lengths.max())
    out = None
    model.eval()
    for batch in iterate(encoded, batch_size, CPU):
        outputs = model(
            **model_inputs(batch), output_hidden_states=feature == "hidden", output_attentions=feature != "hidden"
        )
        values = selected_states(outputs, feature, layers)
        mask = batch["attention_mask"].to(values.dtype)
        if feature == "hidden":
            values = values * mask[:, None, :, None]
        else:
            square = mask[:, :, None] * mask[:, None, :]
            values = values * square.view(square.shape[0], 1, *(1,) * (values.dim() - 4), *square.shape[1:])
        values = values.to(torch.float16).numpy()
        pad = width - values.shape[-2]
        widths = [(0, 0)] * (values.ndim - 2) + ([(0, pad), (0, 0)] if feature == "hidden" else [(0, pad), (0, pad)])
        if out is None:
            tail = values.shape[2:-2] + ((width, values.shape[-1]) if feature == "hidden" else (width, width))
            out = np.zeros((len(encoded), len(layers), *tail), dtype=np.float16)
        out[batch["index"].numpy()] = np.pad(values, widths)
    return out


@pytest.fixture(scope="module")
def dense(teacher, tiny_data) -> dict:
    out = {}
    for feature, layers in LAYERS.items():  # as the pass opens the teacher: eager attention for attention maps only
        opened = open_teacher(teacher, tiny_data, "train", attn=None if feature == "hidden" else "eager")
        out[feature] = dense_dump(opened.model, opened.encoded, feature, layers)
    return out


@pytest.fixture(scope="module")
def encoded(teacher, tiny_data):
    """The train split as the teacher tokenised it, with its gold labels (a student tokenising the same way)."""
    encoded = open_teacher(teacher, tiny_data, "train").encoded
    encoded.labels = read_split(tiny_data, "train")["label_id"].to_numpy()
    return encoded


def test_the_reader_pads_a_batch_as_the_dense_dump_held_it(dumps, dense, encoded, tiny_data):
    """Every training batch of an epoch, every layer slot: the same float32 values as the dense layout cut to the
    batch's width, also for a per-domain student's rows."""
    row_ids = read_split(tiny_data, "train")["row_id"].to_numpy()
    for feature in LAYERS:
        signals = load_signals(("hidden", "attentions"), dumps, row_ids, CPU, attention_feature=feature)
        view = signals["hidden" if feature == "hidden" else "attentions"]
        assert view.lengths.tolist() == encoded.lengths.tolist()
        assert view.token_hashes.tolist() == encoded.token_hashes.tolist()
        for index in training_batches(encoded.lengths, 4, seed=0, epoch=0):
            width = int(encoded.lengths[index].max())
            cut = (slice(None, width),) if feature == "hidden" else (..., slice(None, width), slice(None, width))
            for slot in range(len(LAYERS[feature])):
                want = dense[feature][index, slot][cut].astype(np.float32)
                np.testing.assert_array_equal(view.rows(index, slot, width), want)
        positions = np.arange(1, len(encoded), 3)  # a per-domain student's rows
        part = subset_signals(signals, positions)["hidden" if feature == "hidden" else "attentions"]
        index = np.array([2, 0, 1])
        width = int(encoded.lengths[positions[index]].max())
        cut = (slice(None, width),) if feature == "hidden" else (..., slice(None, width), slice(None, width))
        np.testing.assert_array_equal(part.rows(index, 1, width), dense[feature][positions[index], 1][cut])


class DenseContext(DistillContext):
    """The one access point as it was, on the dense layout: a batch's rows cut to its width."""

    dense: dict

    def teacher_feature(self, teacher, feature, slot, index, width):
        array = self.dense[feature]
        rows = array[index, slot, :width] if feature == "hidden" else array[index, slot, ..., :width, :width]
        return torch.from_numpy(np.asarray(rows, dtype=np.float32))


def _contexts(dumps, dense, encoded, tiny_data, attention_feature: str, student_config):
    row_ids = read_split(tiny_data, "train")["row_id"].to_numpy()
    signals = load_signals(("logits", "hidden", "attentions"), dumps, row_ids, CPU, attention_feature)
    n, rng = len(encoded), np.random.default_rng(0)
    signals.update(domain=rng.normal(size=(n, 32)).astype(np.float16), expertise=torch.full((n,), 0.4))
    common = dict(
        labels=signals["labels"],
        teachers=["t"],
        blocks={"t": np.arange(len(signals["labels"]))},
        signals={"t": signals},
        device=CPU,
        student_config=student_config,
        train_lengths=encoded.lengths,
        train_tokens=encoded.token_hashes,
        domains=["a", "b"],
        domain_ids=torch.as_tensor(np.arange(n) % 2),
        prototype_scores=torch.as_tensor(rng.uniform(0.5, 1.0, n), dtype=torch.float32),
    )
    old = DenseContext(**common)
    old.dense = {"hidden": dense["hidden"], "attentions": dense[attention_feature]}
    return DistillContext(**common), old


@pytest.mark.parametrize(
    "method, alignment, attention_feature",
    [
        ("dfa", [[1, 1], [2, 2]], "attentions"),
        ("dynamic_objective", [[0, 0], [1, 1], [2, 2]], "attentions"),
        ("meta_kd_stage1", [[0, 0], [1, 1], [2, 2]], "attentions"),
        ("meta_kd_stage1", [[0, 0], [1, 1], [2, 2]], "attentions_mean"),
    ],
)
def test_methods_give_the_losses_of_the_dense_layout(
    dumps, dense, encoded, teacher, tiny_data, method, alignment, attention_feature
):
    build = {"dfa": dfa.build, "dynamic_objective": dynamic_kd.build_objective, "meta_kd_stage1": meta_kd.build_stage1}
    labels = json.loads((teacher / "labels.json").read_text())
    student = load_classifier("builtin:tiny-bert", labels, seed=3, attn="eager").eval()  # no dropout: same forward
    batches = training_batches(encoded.lengths, 4, seed=1, epoch=0)[:3]
    losses = []
    for ctx in _contexts(dumps, dense, encoded, tiny_data, attention_feature, student.config):
        ctx.alignment = {"t": alignment}
        torch.manual_seed(0)  # the same fresh adapters
        objective = build[method](ctx, method_args(method, {}))
        losses.append([objective.loss(student, collate(encoded, index))[0].item() for index in batches])
    assert losses[0] == losses[1] and all(np.isfinite(losses[0]))


# ---- the checked reader ------------------------------------------------------------------------------------------


def _copy(dumps: Path, tmp_path: Path, feature: str = "hidden") -> Path:
    for name in (f"{feature}.npy", f"{feature}.offsets.npy", f"{feature}.tokens.npy", f"{feature}.json"):
        (tmp_path / name).write_bytes((dumps / name).read_bytes())
    return tmp_path / f"{feature}.npy"


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"hidden_size": 16}, "does not fit its offsets and row lengths"),
        ({"layers": [0, 1]}, "does not fit its offsets and row lengths"),
        ({"rows": 3}, "holds .* rows but its manifest"),
    ],
)
def test_a_dump_that_does_not_fit_its_manifest_is_refused(dumps, tiny_data, tmp_path, edit, message):
    path = _copy(dumps, tmp_path)
    manifest = json.loads((tmp_path / "hidden.json").read_text())
    (tmp_path / "hidden.json").write_text(json.dumps({**manifest, **edit}))
    row_ids = read_split(tiny_data, "train")["row_id"].to_numpy()
    with pytest.raises(ArtifactError, match=message):
        read_features(path, row_ids)


def test_a_changed_sidecar_is_refused(dumps, tiny_data, tmp_path):
    path = _copy(dumps, tmp_path)
    offsets = np.load(tmp_path / "hidden.offsets.npy")
    offsets[1] += 1
    np.save(tmp_path / "hidden.offsets.npy", offsets)
    row_ids = read_split(tiny_data, "train")["row_id"].to_numpy()
    with pytest.raises(ArtifactError, match=r"hidden\.offsets\.npy: changed since kdpipe wrote it"):
        read_features(path, row_ids)


def test_a_dump_without_the_layers_a_reader_needs_is_refused(dumps, tiny_data):
    row_ids = read_split(tiny_data, "train")["row_id"].to_numpy()
    with pytest.raises(ArtifactError, match=r"holds layers \[0, 1, 2\], the reader needs \[3\]"):
        read_features(dumps / "hidden.npy", row_ids, [3])


def test_the_manifest_holds_no_per_row_lists(dumps):
    manifest = json.loads((dumps / "hidden.json").read_text())
    assert not any(isinstance(v, list) and len(v) > 3 for k, v in manifest.items() if k not in ("labels",))
    lengths = np.load(dumps / "hidden.tokens.npy")["length"]
    assert manifest["tokens"] == lengths.sum() and manifest["bytes"] == 2 * 3 * 32 * lengths.sum()
    assert set(manifest["checksums"]) == {"hidden.npy", "hidden.offsets.npy", "hidden.tokens.npy"}


# ---- signals: online ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, alignment, attention_feature",
    [
        ("dfa", [[1, 1], [2, 2]], "attentions"),
        ("dynamic_objective", [[0, 0], [1, 1], [2, 2]], "attentions"),
        ("meta_kd_stage1", [[0, 0], [1, 1], [2, 2]], "attentions"),
        ("meta_kd_stage1", [[0, 0], [1, 1], [2, 2]], "attentions_mean"),
    ],
)
def test_online_signals_give_the_losses_of_the_cached_ones(
    dumps, encoded, teacher, tiny_data, method, alignment, attention_feature
):
    """The teacher run in the student's job, on each batch: the cached values to float16 rounding, the same losses
    to float tolerance."""
    build = {"dfa": dfa.build, "dynamic_objective": dynamic_kd.build_objective, "meta_kd_stage1": meta_kd.build_stage1}
    labels = json.loads((teacher / "labels.json").read_text())
    student = load_classifier("builtin:tiny-bert", labels, seed=3, attn="eager").eval()
    cached, _ = _contexts(
        dumps, {"hidden": None, attention_feature: None}, encoded, tiny_data, attention_feature, student.config
    )
    job = SimpleNamespace(train=read_split(tiny_data, "train"), transfer=None, device=CPU)
    online = online_signals(
        get_method(method).signals,
        [teacher],
        job,
        teachers=["t"],
        alignment={"t": alignment},
        attention_feature=attention_feature,
    )["t"]
    assert set(online) == {"labels", *({"hidden", "attentions"} & set(get_method(method).signals))}
    live = replace(cached, signals={"t": {**cached.signals["t"], **online}})
    names = [n for n in ("hidden", "attentions") if n in online]
    for index in training_batches(encoded.lengths, 4, seed=1, epoch=0)[:3]:
        width = int(encoded.lengths[index].max())
        for name in names:  # online: only the aligned layers; the dumps here hold more (LAYERS)
            for slot, layer in enumerate(online[name].layers):
                got = live.teacher_feature("t", name, slot, index, width)
                want = cached.teacher_feature("t", name, cached.hidden_slot("t", layer, name), index, width)
                assert got.shape == want.shape and (got[want == 0] == 0).all()  # zero past each row's length
                torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    losses = []
    for ctx in (cached, live):
        ctx.alignment = {"t": alignment}
        torch.manual_seed(0)
        objective = build[method](ctx, method_args(method, {}))
        batches = training_batches(encoded.lengths, 4, seed=1, epoch=0)[:3]
        losses.append([objective.loss(student, collate(encoded, index))[0].item() for index in batches])
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-3)


def test_an_online_student_trains_without_dumps_and_loads_its_teacher_once(
    dumps, teacher, tiny_data, tmp_path, monkeypatch
):
    """The distill stage with ``signals: online``: the cached logits, no hidden-state dump, the teacher loaded in
    the job; the same student without it stops at the missing dump."""
    import kdpipe.signals.online as online
    from kdpipe.stages import distill
    from tests.conftest import student_job, student_settings
    from tests.test_stage_errors import STUDENT

    signals = tmp_path / "signals"
    (signals / "t/train").mkdir(parents=True)
    for name in ("logits.parquet", "logits.json"):
        (signals / "t/train" / name).write_bytes((dumps / name).read_bytes())
    params = student_job({**STUDENT, "method": "dfa", "teachers": ["t"], "alignment": {"t": [[1, 2]]}})
    with pytest.raises(ArtifactError, match=r"t/train/hidden\.json: missing"):
        distill.run(student_settings(params), tiny_data, signals, tmp_path / "cached")
    loaded, load_trained = [], online.load_trained
    monkeypatch.setattr(
        online, "load_trained", lambda folder, **kw: loaded.append(folder) or load_trained(folder, **kw)
    )
    out = tmp_path / "online"
    online_student = student_settings({**params, "signals": "online"})
    manifest = distill.run(online_student, tiny_data, signals, out, teacher_dirs=[teacher])
    assert loaded == [teacher] and manifest["method"] == "dfa" and (out / "model.safetensors").exists()
