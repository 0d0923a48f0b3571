"""The BiLSTM student (ProKT's, docs/methods.md §5) and the separate tokenisation of sentence pairs it reads."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import collate, encode, model_inputs
from kdpipe.models.bilstm import BiLSTMClassifier
from kdpipe.models.loading import load_tokenizer, load_trained
from kdpipe.models.students import build_student
from kdpipe.plan import Plan
from tests.conftest import REPO, model_spec

LABELS = ["a", "b", "c"]
SIZES = {
    "type": "bilstm",
    "tokenizer": "builtin:tiny-bert",
    "embedding_dim": 8,
    "hidden_size": 6,
    "fc_size": 10,
    "dropout": 0.0,
}


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:tiny-bert")


def test_single_texts_shapes_and_defaults(tokenizer):
    model, tok = build_student(model_spec({"type": "bilstm", "tokenizer": "builtin:tiny-bert"}), LABELS, seed=0)
    assert isinstance(model, BiLSTMClassifier) and len(tok) == len(tokenizer)
    # ProKT's sizes: embeddings 300, 300 units per direction, dropout 0.4, fc 600 on u (2 x 300)
    assert (
        model.embeddings.embedding_dim,
        model.lstm.hidden_size,
        model.fc.in_features,
        model.fc.out_features,
        model.dropout.p,
    ) == (300, 300, 600, 600, 0.4)
    enc = encode(tokenizer, ["one two three", "four"], max_length=16)
    assert model(**model_inputs(collate(enc, np.arange(2)))).logits.shape == (2, 3)


def test_padding_never_changes_a_prediction(tokenizer):
    """Max-pooling skips padded positions and the LSTM stops at each row's length: a row alone and the same row
    padded inside a batch with a longer one get the same logits."""
    model, _ = build_student(model_spec(SIZES), LABELS, seed=0)
    model.eval()
    enc = encode(tokenizer, ["short text", "a much longer text with many more word pieces in it"], max_length=32)
    together = model(**model_inputs(collate(enc, np.arange(2)))).logits[0]
    alone = model(**model_inputs(collate(enc, np.array([0])))).logits[0]
    assert torch.allclose(together, alone, atol=1e-6)


def test_pairs_are_encoded_apart_and_combined(tokenizer):
    texts, pairs = ["the cat sat", "a dog"], ["on the mat today", "ran"]
    enc = encode(tokenizer, texts, pairs, max_length=16, separate_pairs=True)
    alone = encode(tokenizer, texts, max_length=16)
    other = encode(tokenizer, pairs, max_length=16)
    assert all(np.array_equal(a, b) for a, b in zip(enc.input_ids, alone.input_ids))
    assert all(np.array_equal(a, b) for a, b in zip(enc.pair_ids, other.input_ids))
    assert enc.token_type_ids is None
    assert list(enc.lengths) == [len(a) + len(b) for a, b in zip(alone.input_ids, other.input_ids)]
    batch = collate(enc, np.arange(2))
    assert batch["pair_input_ids"].shape == (2, max(len(x) for x in other.input_ids))

    model, _ = build_student(model_spec(SIZES), LABELS, seed=0, pairs=True)
    model.eval()
    assert model.fc.in_features == 4 * 2 * 6  # [u; v; |u - v|; u * v], u, v in R^(2h)
    inputs = model_inputs(batch)
    u = model.encode(inputs["input_ids"], inputs["attention_mask"])
    v = model.encode(inputs["pair_input_ids"], inputs["pair_attention_mask"])
    features = torch.cat([u, v, (u - v).abs(), u * v], -1)
    expected = model.classifier(torch.relu(model.fc(features)))
    assert torch.allclose(model(**inputs).logits, expected, atol=1e-6)
    with pytest.raises(ValueError, match="pair_input_ids"):
        model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])

    transformer_way = encode(tokenizer, texts, pairs, max_length=16)  # one sequence [CLS] a [SEP] b [SEP]
    assert transformer_way.pair_ids is None and transformer_way.token_type_ids[0].max() == 1


def test_save_and_load_round_trip(tokenizer, tmp_path):
    model, tok = build_student(model_spec(SIZES), LABELS, seed=3, pairs=True)
    model.save_pretrained(tmp_path)
    loaded = load_trained(tmp_path)
    assert isinstance(loaded, BiLSTMClassifier) and loaded.config == model.config
    assert loaded.config.id2label == {0: "a", 1: "b", 2: "c"}
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match=r"kdpipe-bilstm \(load it with kdpipe\.models\.loading\.load_trained"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path)


def planned(config: dict) -> Plan:
    """The plan of ``config`` with the schema's defaults filled in, as the workflow makes it."""
    from snakemake.utils import validate

    validate(config, str(REPO / "kdpipe/config.schema.yaml"), set_default=True)
    return Plan(config)


def test_plan_refuses_a_bilstm_for_methods_that_need_transformer_layers():
    config = {
        "dataset": {"name": "d"},
        "teachers": {"ta": {"backbone": "builtin:tiny-bert"}},
        "student_defaults": {},
        "mc_dropout": {},
        "dump": {},
        "evaluate": {"splits": ["test"]},
        "students": {"s": {"method": "dynamic_objective", "model": {"type": "bilstm"}, "teachers": ["ta"]}},
    }
    with pytest.raises(KdpipeError, match="students.s.model: a BiLSTM student has no transformer layers"):
        planned(config)
    config["students"]["s"]["method"] = "vanilla_kd"
    assert planned(config).student_teachers("s") == ["ta"]


def test_plan_gives_a_prokt_student_its_cotrained_teacher_and_no_cached_teachers():
    config = {
        "dataset": {"name": "d"},
        "teachers": {"ta": {"backbone": "builtin:tiny-bert"}},
        "student_defaults": {},
        "mc_dropout": {},
        "dump": {},
        "evaluate": {"splits": ["test"]},
        "export": {"onnx": False, "int8": False, "students": "all"},
        "students": {
            "p": {"method": "prokt", "model": {"type": "bilstm"}, "seeds": [0, 1]},
            "v": {"method": "vanilla_kd", "model": {"type": "bilstm"}},
        },
    }
    plan = planned(config)
    assert plan.stage_students("cotrain") == ["p.seed0", "p.seed1"] and plan.stage_students("distill") == ["v"]
    assert plan.student_teachers("p.seed1") == [] and plan.signal_files("p.seed1") == []
    assert plan.model_dir("p.seed1.teacher") == "results/cotrained/p.seed1"
    assert "p.seed0.teacher" in plan.models()
    assert plan.eval_params("p.seed1.teacher")["kind"] == "teacher"
    config["students"]["p"]["teachers"] = ["ta"]
    with pytest.raises(KdpipeError, match="students.p.teachers: method 'prokt' trains its own teacher"):
        planned(config)


def test_bilstm_learns_a_separable_task_with_the_shared_loop():
    import torch.nn.functional as F

    from kdpipe.training.loop import TrainSettings, fit
    from tests.test_training import LABELS as Y
    from tests.test_training import TEXTS, validator

    model, tok = build_student(model_spec({**SIZES, "dropout": 0.1}), ["sport", "money"], seed=0)
    data = encode(tok, TEXTS, max_length=16, labels=Y)

    def ce(model, batch):
        return F.cross_entropy(model(**model_inputs(batch)).logits, batch["labels"]), {}

    result = fit(
        model,
        train=data,
        loss_fn=ce,
        validate=validator(data),
        settings=TrainSettings(epochs=6, lr=1e-2, batch_size=8, seed=0),
        device=torch.device("cpu"),
    )
    assert result.best_metrics["accuracy"] == 1.0
