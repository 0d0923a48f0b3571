"""One source of truth: Dynamic KD's choices are declared once, each information measure (entropy, normalised entropy,
NLL) has one implementation that every caller uses, and each training default is written once, in the config
schema. Each test fails when a second place reappears."""

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from kdpipe import CONFIG_SCHEMA
from kdpipe.evaluation.information import entropy, nll, normalized_entropy
from kdpipe.methods import dynamic_choices
from kdpipe.methods.registry import METHODS
from kdpipe.training.loop import TrainSettings, accuracy_validator

REPO = Path(__file__).resolve().parents[1]

# ---- Dynamic KD's choices -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, arg, choices",
    [
        ("dynamic_teacher", "distance", "DISTANCES"),
        ("dynamic_teacher", "mode", "TEACHER_MODES"),
        ("dynamic_teacher", "direction", "DIRECTIONS"),
        ("dynamic_data", "distance", "DISTANCES"),
        ("dynamic_data", "strategy", "DATA_STRATEGIES"),
        ("dynamic_objective", "distance", "DISTANCES"),
        ("dynamic_objective", "strategy", "OBJECTIVE_STRATEGIES"),
    ],
)
def test_the_registry_declares_the_choices_dynamic_kd_implements(method, arg, choices):
    declared = next(a for a in METHODS[method].args if a.name == arg)
    assert declared.choices is getattr(dynamic_choices, choices)


# ---- information measures -------------------------------------------------------------------------------------

RNG = np.random.default_rng(0)
SAMPLES = torch.softmax(torch.tensor(RNG.normal(0, 3, (5, 64, 4)), dtype=torch.float32), -1)  # [T, B, C]
PROBS = SAMPLES[0].numpy()
LABELS = RNG.integers(0, 4, 64)


def same_bits(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_the_mc_dropout_scores_are_the_shared_entropy():
    from kdpipe.signals.mc_dropout import summarise

    summary = summarise(SAMPLES)
    mean = SAMPLES.mean(0).numpy()
    assert same_bits(summary["entropy"], normalized_entropy(mean))
    assert same_bits(summary["certainty"], 1.0 - normalized_entropy(mean))
    assert same_bits(summary["mean_entropy"], normalized_entropy(SAMPLES.numpy()).mean(0))


def test_the_certainty_router_scores_are_the_shared_entropy():
    from kdpipe.routing.certainty import certainty_scores

    logits = np.log(PROBS)
    tempered = torch.softmax(torch.tensor(logits) / 2.0, -1).numpy()
    score = certainty_scores("logit_entropy", logits=logits, temperature=2.0).numpy()
    assert same_bits(score, 1.0 - normalized_entropy(tempered))
    # a one-class teacher is fully certain
    assert certainty_scores("logit_entropy", logits=np.zeros((3, 1), np.float32)).tolist() == [1.0] * 3


def test_the_metrics_and_the_validation_use_the_shared_entropy_and_nll():
    from kdpipe.evaluation.metrics import classification_metrics, uncertainty_split

    probs = PROBS.astype(np.float64)
    metrics = classification_metrics(probs, LABELS, list("abcd"))
    assert metrics["nll"] == nll(probs, LABELS)
    assert metrics["mean_entropy"] == float(np.mean(entropy(probs)))
    split = uncertainty_split(SAMPLES.numpy().astype(np.float64))
    assert same_bits(split["total"], entropy(SAMPLES.numpy().astype(np.float64).mean(0)))
    validation = accuracy_validator(lambda model: PROBS, LABELS)(None)
    assert validation["nll"] == nll(PROBS, LABELS)


def test_dynamic_kd_entropy_is_the_torch_form_of_the_shared_one():
    from kdpipe.methods.dynamic_kd import normalized_entropy as torch_normalized_entropy

    logits = torch.log(SAMPLES[0])
    np.testing.assert_allclose(torch_normalized_entropy(logits).numpy(), normalized_entropy(PROBS), atol=1e-6)


# ---- training defaults ----------------------------------------------------------------------------------------

SCHEMA = yaml.safe_load(CONFIG_SCHEMA.read_text())["properties"]
ROLES = ("teacher_defaults", "student_defaults")
SETTINGS = [f for f in dataclasses.fields(TrainSettings) if f.name in SCHEMA["student_defaults"]["properties"]]


def test_train_settings_write_no_default_the_schema_has():
    assert {f.name for f in SETTINGS} >= {"epochs", "lr", "batch_size", "seed", "checkpoint_every"}
    written = [f.name for f in SETTINGS if f.default is not dataclasses.MISSING]
    assert not written, f"TrainSettings writes defaults of its own for {written}: take them from the schema"


def test_train_settings_left_out_take_the_schema_defaults():
    settings = TrainSettings(epochs=1, lr=1.0)
    for role in ROLES:
        for f in SETTINGS:
            if f.default_factory is not dataclasses.MISSING:
                assert getattr(settings, f.name) == SCHEMA[role]["properties"][f.name]["default"], (role, f.name)


def test_the_schema_writes_each_shared_training_default_once():
    """A training default that teachers and students share is written in teacher_defaults and named there by
    student_defaults (a YAML alias), not written twice."""
    root = yaml.compose(CONFIG_SCHEMA.read_text())

    def default_node(role: str, key: str):
        node = root
        for name in ("properties", role, "properties", key, "default"):
            node = next(value for k, value in node.value if k.value == name)
        return node

    for f in SETTINGS:
        teacher, student = (default_node(role, f.name) for role in ROLES)
        if yaml.safe_load(yaml.serialize(teacher)) == yaml.safe_load(yaml.serialize(student)):
            assert teacher is student, f"{f.name}: the same default is written twice; write *{f.name} in students"
