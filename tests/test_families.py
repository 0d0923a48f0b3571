"""Hugging Face families as teachers and students: shapes read through AutoConfig, layer subsets that reload to the
same model, padding for decoder-only classifiers, MC-dropout on a model without dropout, and teacher -> signals ->
student on each family (tiny random models with a byte-level BPE tokenizer, built in-process)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.models.backbones import model_shape, strided_alignment
from kdpipe.models.loading import keep_layers, load_classifier, load_tokenizer, load_trained
from kdpipe.signals.io import read_features
from kdpipe.signals.mc_dropout import set_dropout
from kdpipe.stages import distill, finetune_teacher
from tests.conftest import TINY_TEACHER, run_signal, student_settings, teacher_settings
from tests.test_stage_errors import STUDENT
from tests.tiny_models import tiny_family

FAMILIES = ["bert", "roberta", "distilbert", "deberta-v2", "electra", "modernbert", "gpt2", "llama", "qwen2"]
DECODERS = ["gpt2", "llama", "qwen2"]
NO_DROPOUT = ["modernbert", "llama", "qwen2"]  # every dropout rate 0 by default
LABELS = ["business", "entertainment", "politics"]


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: tiny_family(root / f, f, pad=f not in DECODERS) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_shapes_through_autoconfig(backbones, family):
    assert model_shape(str(backbones[family])) == (3, 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_layer_subset_reloads_to_the_same_classifier(backbones, family, tmp_path):
    model = keep_layers(load_classifier(str(backbones[family]), LABELS, seed=0), [0, 2]).eval()
    tokenizer = load_tokenizer(str(backbones[family]))
    model.save_pretrained(tmp_path)
    reloaded = load_trained(tmp_path).eval()
    assert reloaded.config.num_hidden_layers == 2
    batch = tokenizer(["the markets fell sharply today", "a film"], padding=True, return_tensors="pt")
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**batch).logits, model(**batch).logits)


@pytest.mark.parametrize("family", DECODERS)
def test_decoder_classifiers_pad_and_read_each_rows_last_token(backbones, family):
    tokenizer = load_tokenizer(str(backbones[family]))
    assert tokenizer.pad_token == tokenizer.eos_token  # shipped without one
    model = load_classifier(str(backbones[family]), LABELS, seed=0).eval()
    assert model.config.pad_token_id == tokenizer.pad_token_id
    texts = ["the markets fell sharply today", "a film"]
    with torch.no_grad():
        together = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits
        alone = torch.cat([model(**tokenizer([t], return_tensors="pt")).logits for t in texts])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


def test_mc_dropout_refuses_a_model_without_dropout_or_sets_a_rate(backbones):
    model = load_classifier(str(backbones["modernbert"]), LABELS, seed=0)  # ModernBERT: every rate 0 by default
    with pytest.raises(KdpipeError, match=r"dropout is zero everywhere.*set mc_dropout\.dropout"):
        set_dropout(model, None, "teacher")
    set_dropout(model, 0.2, "teacher")
    set_dropout(model, None, "teacher")  # now it has some
    assert {m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)} == {0.2}


@pytest.mark.parametrize("family", FAMILIES)
def test_teacher_signals_and_student_on_each_family(backbones, family, tiny_data, tmp_path):
    """A teacher of the family, its logits, MC-dropout and hidden-state dumps, and a 2-layer student of the same
    family (layer-subset init) distilled with DFA from its hidden states."""
    teacher = tmp_path / "teacher"
    params = {**TINY_TEACHER, "backbone": str(backbones[family]), "max_length": 16}
    finetune_teacher.run(teacher_settings(params), tiny_data, teacher)
    signals = tmp_path / "signals/t/train"
    run_signal("logits", {"batch_size": 8, "split": "train", "signal": "logits"}, teacher, tiny_data, signals)
    mc = {"samples": 3, "seed": 0, "batch_size": 8, "max_batch_rows": 64, "split": "train", "signal": "mc"}
    mc["dropout"] = 0.1 if family in NO_DROPOUT else None
    run_signal("mc", mc, teacher, tiny_data, signals)
    assert (pd.read_parquet(signals / "mc.parquet")["variance"] > 0).all()  # the dropout passes differ
    hidden = {"batch_size": 8, "split": "train", "signal": "hidden", "layers": [2, 3]}
    manifest = run_signal("hidden", hidden, teacher, tiny_data, signals)
    row_ids = pd.read_parquet(tiny_data / "train.parquet")["row_id"].to_numpy()
    dump, offsets, tokens, _ = read_features(signals / "hidden.npy", row_ids)  # [T, layers, H], no padding
    assert dump.shape == (manifest["tokens"], 2, 32) and len(tokens) == manifest["rows"]
    assert 0 < tokens["length"].max() <= 16 and offsets[-1] == tokens["length"].sum()
    attentions = {"batch_size": 8, "split": "train", "signal": "attentions", "layers": [3]}
    run_signal("attentions", attentions, teacher, tiny_data, signals)
    maps, offsets, tokens, _ = read_features(signals / "attentions.npy", row_ids)  # rows of [layers, heads, n, n]
    n = int(tokens["length"][0])
    first = maps[: offsets[1]].reshape(1, 2, n, n)  # rows summing to 1
    np.testing.assert_allclose(first[0, 0, 0].astype(np.float32).sum(), 1, atol=1e-2)
    student = {
        **STUDENT,
        "method": "dfa",
        "teachers": ["t"],
        "max_length": 16,
        "model": {"init": {"from": str(backbones[family]), "layers": [0, 2]}},
        "alignment": {"t": [list(pair) for pair in strided_alignment(3, 2)]},  # student 2 <-> 3, 1 <-> 2
    }
    out = distill.run(student_settings(student), tiny_data, tmp_path / "signals", tmp_path / "student")
    assert out["labels"] == ["business", "entertainment", "politics", "sport", "tech"]
    assert load_trained(tmp_path / "student").config.num_hidden_layers == 2


@pytest.fixture(scope="module")
def bpe_signals(backbones, tiny_data, tmp_path_factory):
    """Logits of two RoBERTa teachers with a byte-level BPE tokenizer (all classes; "small" keeps 2 of 3 layers)."""
    root = tmp_path_factory.mktemp("bpe_signals")
    for name, layers in (("big", None), ("small", [0, 2])):
        params = {**TINY_TEACHER, "backbone": str(backbones["roberta"]), "max_length": 16, "layers": layers}
        finetune_teacher.run(teacher_settings(params), tiny_data, root / "teachers" / name)
        logits = {"batch_size": 8, "split": "train", "signal": "logits"}
        run_signal("logits", logits, root / "teachers" / name, tiny_data, root / "signals" / name / "train")
    return root / "signals"


TWO_LAYERS = {**STUDENT["model"]["config"], "num_layers": 2}


@pytest.mark.parametrize(
    "method, extra",
    [
        ("vanilla_kd", {}),
        ("dynamic_teacher", {"method_args": {"small_teacher": "small"}}),
        ("dynamic_data", {}),
        ("hydra", {"model": {"config": TWO_LAYERS, "heads": {"count": 2, "layers": 1}}}),
    ],
)
def test_logit_methods_distil_bpe_teachers_into_a_wordpiece_student(bpe_signals, tiny_data, tmp_path, method, extra):
    """Signals are keyed by row: a student with another tokenizer than its teachers' learns from them."""
    student = {**STUDENT, "method": method, "teachers": ["big", "small"], **extra}  # tiny BERT, WordPiece
    manifest = distill.run(student_settings(student), tiny_data, bpe_signals, tmp_path / "student")
    assert manifest["method"] == method and len(manifest["labels"]) == 5
    assert load_tokenizer(str(tmp_path / "student")).__class__.__name__.startswith("Bert")
