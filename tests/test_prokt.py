"""ProKT (docs/methods.md §5): both update objectives against hand-computed values, the co-trained teacher really
moves (a frozen teacher's cached logits do not), and a resumed co-training equals an uninterrupted one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.data.batching import encode
from kdpipe.methods import prokt
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.models.students import build_student
from kdpipe.training.loop import TrainSettings, fit, total_steps
from tests.conftest import method_args, model_spec
from tests.test_training import LABELS, TEXTS, read_resume_state, validator

CPU = torch.device("cpu")

# A fixed batch of two examples, two classes.
Z_T = torch.tensor([[0.0, math.log(3.0)], [0.0, 0.0]])  # softmax: [1/4, 3/4], [1/2, 1/2]
Y = torch.tensor([1, 0])
P_S = torch.tensor([[0.5, 0.5], [0.8, 0.2]])


def by_hand_ce_and_kl():
    ce = (-math.log(3 / 4) - math.log(1 / 2)) / 2
    kl_0 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    kl_1 = 0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)
    return ce, (kl_0 + kl_1) / 2


def test_teacher_objective_by_hand():
    ce, kl = by_hand_ce_and_kl()
    loss, got_ce, got_kl = prokt.teacher_loss(Z_T, Y, P_S, move_back_weight=0.4)
    assert got_ce.item() == pytest.approx(ce, abs=1e-6)
    assert got_kl.item() == pytest.approx(kl, abs=1e-6)
    assert loss.item() == pytest.approx(0.6 * ce + 0.4 * kl, abs=1e-6)
    # λ = 0: plain fine-tuning; λ = 1: only the pull towards the student
    assert prokt.teacher_loss(Z_T, Y, P_S, 0.0)[0].item() == pytest.approx(ce, abs=1e-6)
    assert prokt.teacher_loss(Z_T, Y, P_S, 1.0)[0].item() == pytest.approx(kl, abs=1e-6)


def test_dual_objective_and_multiplier_update_by_hand():
    ce, kl = by_hand_ce_and_kl()
    loss, _, got_kl = prokt.dual_teacher_loss(Z_T, Y, P_S, beta=2.0, epsilon=0.1)
    assert loss.item() == pytest.approx(ce + 2.0 * (kl - 0.1), abs=1e-6)
    assert prokt.updated_multiplier(2.0, got_kl.item(), 0.1, 0.5) == pytest.approx(2.0 + 0.5 * (kl - 0.1))
    assert prokt.updated_multiplier(0.01, 0.0, 1.0, 1.0) == 0.0  # clipped at zero


def test_student_objective_by_hand():
    z_s = torch.tensor([[0.0, 0.0], [math.log(4.0), 0.0]])  # softmax: [1/2, 1/2], [4/5, 1/5]
    p_t = torch.tensor([[0.25, 0.75], [0.5, 0.5]])
    kl_0 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    kl_1 = 0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)
    assert prokt.student_loss(z_s, p_t).item() == pytest.approx((kl_0 + kl_1) / 2, abs=1e-6)


def test_unknown_or_bad_arguments_are_refused():
    with pytest.raises(KdpipeError, match="unknown key 'lambda'"):
        method_args("prokt", {"lambda": 0.3})
    with pytest.raises(KdpipeError, match="move_back_weight must be in"):
        prokt.checked_args(method_args("prokt", {"move_back_weight": 1.5}))


@pytest.fixture(scope="module")
def data():
    return encode(load_tokenizer("builtin:tiny-bert"), TEXTS, max_length=16, labels=LABELS)


SETTINGS = dict(epochs=3, lr=1e-2, batch_size=8, seed=0, checkpoint_every=3, log_every=1)


def cotrainer(data, settings, **args):
    teacher = load_classifier("builtin:tiny-bert", ["sport", "money"], seed=1)
    prokt.zero_classifier(teacher)
    args = prokt.checked_args(method_args("prokt", {"backbone": "builtin:tiny-bert", "teacher_lr": 1e-2, **args}))
    return prokt.CoTrainedTeacher(teacher, data, args, settings, total_steps(len(data), settings), CPU)


def student():
    model, _ = build_student(
        model_spec(
            {
                "config": {
                    "tokenizer": "builtin:tiny-bert",
                    "hidden_size": 32,
                    "num_layers": 1,
                    "num_heads": 2,
                    "intermediate_size": 64,
                }
            }
        ),
        ["sport", "money"],
        seed=0,
    )
    prokt.zero_classifier(model)
    return model


def test_teacher_schedule_has_no_warmup_and_no_weight_decay_by_default(data):
    """As the release's Trainer defaults: lr_T from step 0 decaying linearly, AdamW weight decay 0, whatever the
    student's own warm-up and weight decay."""
    settings = TrainSettings(**{**SETTINGS, "warmup_ratio": 0.1, "weight_decay": 0.01})
    steps = total_steps(len(data), settings)
    cotrained = cotrainer(data, settings, teacher_lr=2e-3)
    assert cotrained.scheduler.get_last_lr() == [pytest.approx(2e-3)] * len(cotrained.optimizer.param_groups)
    assert [g["weight_decay"] for g in cotrained.optimizer.param_groups] == [0.0, 0.0]
    assert cotrained.settings.max_grad_norm == settings.max_grad_norm == 1.0
    for _ in range(steps // 2):
        cotrained.optimizer.step()
        cotrained.scheduler.step()
    assert cotrained.scheduler.get_last_lr()[0] == pytest.approx(2e-3 * (steps - steps // 2) / steps)


def test_teacher_warmup_and_weight_decay_can_be_set(data):
    settings = TrainSettings(**{**SETTINGS, "warmup_ratio": 0.0, "weight_decay": 0.0})
    steps = total_steps(len(data), settings)
    cotrained = cotrainer(data, settings, teacher_lr=2e-3, teacher_warmup=0.1, teacher_weight_decay=0.05)
    assert cotrained.scheduler.get_last_lr()[0] == 0.0
    assert [g["weight_decay"] for g in cotrained.optimizer.param_groups] == [0.05, 0.0]  # biases, norms: 0
    warmup = int(0.1 * steps)
    for _ in range(warmup):
        cotrained.optimizer.step()
        cotrained.scheduler.step()
    assert cotrained.scheduler.get_last_lr()[0] == pytest.approx(2e-3)


@pytest.mark.parametrize(
    ("key", "value"), [("teacher_warmup", 1.5), ("teacher_warmup", -0.1), ("teacher_weight_decay", -1.0)]
)
def test_bad_teacher_schedule_is_refused(key, value):
    with pytest.raises(KdpipeError, match=f"{key} must be"):
        prokt.checked_args(method_args("prokt", {key: value}))


def test_the_teachers_best_epoch_breaks_ties_by_nll(data):
    cotrained = cotrainer(data, TrainSettings(**SETTINGS))
    for epoch, (score, nll) in enumerate([(0.5, 0.7), (0.75, 0.6), (0.75, 0.4), (0.75, 0.5)], 1):
        cotrained.observe({"score": score, "accuracy": score, "nll": nll}, epoch)
    assert cotrained.best_epoch == 3 and cotrained.best_metrics["nll"] == 0.4


def test_zero_classifier_makes_uniform_predictions(data):
    from kdpipe.data.batching import collate, model_inputs

    model = student()
    logits = model(**model_inputs(collate(data, np.arange(4)))).logits
    assert torch.equal(logits, torch.zeros_like(logits))


@pytest.mark.parametrize("dual", [False, True])
def test_cotraining_moves_the_teacher_and_the_student_learns(data, dual):
    # 15 epochs: with the teacher's release schedule (no warm-up, no weight decay) 10 epochs of this tiny run leave the
    # non-dual student short of the teacher
    settings = TrainSettings(**{**SETTINGS, "epochs": 15})
    cotrained = cotrainer(data, settings, dual=dual)
    before = {k: v.clone() for k, v in cotrained.model.state_dict().items()}
    model = student()
    result = fit(
        model,
        train=data,
        loss_fn=prokt.build(cotrained).loss,
        validate=validator(data),
        settings=settings,
        device=CPU,
        extra_state=cotrained,
    )
    after = cotrained.model.state_dict()
    moved = [k for k in before if not torch.equal(before[k], after[k])]
    assert "classifier.weight" in moved and any("encoder.layer.0" in k for k in moved)
    # the teacher learns the task from its pre-trained start, and the student, which never sees a label, follows
    assert validator(data)(cotrained.model)["accuracy"] == 1.0
    assert result.best_metrics["accuracy"] == 1.0
    if dual:
        assert cotrained.beta != 1.0  # the multiplier was updated


def test_cotraining_resumes_teacher_and_student_exactly(data, tmp_path):
    settings = TrainSettings(**SETTINGS)
    straight_teacher = cotrainer(data, settings, dual=True)
    straight = student()
    fit(
        straight,
        train=data,
        loss_fn=prokt.build(straight_teacher).loss,
        validate=validator(data),
        settings=settings,
        device=CPU,
        extra_state=straight_teacher,
    )

    calls = {"n": 0}
    interrupted_teacher = cotrainer(data, settings, dual=True)
    objective = prokt.build(interrupted_teacher)

    def dies_at_step_7(model, batch):
        calls["n"] += 1
        if calls["n"] == 7:
            raise KeyboardInterrupt
        return objective.loss(model, batch)

    with pytest.raises(KeyboardInterrupt):
        fit(
            student(),
            train=data,
            loss_fn=dies_at_step_7,
            validate=validator(data),
            settings=settings,
            device=CPU,
            resume_dir=tmp_path / "resume",
            extra_state=interrupted_teacher,
        )
    assert read_resume_state(tmp_path / "resume")["epoch"] == 1
    resumed_teacher = cotrainer(data, settings, dual=True)  # a fresh process: new objects, state from disk
    resumed = student()
    fit(
        resumed,
        train=data,
        loss_fn=prokt.build(resumed_teacher).loss,
        validate=validator(data),
        settings=settings,
        device=CPU,
        resume_dir=tmp_path / "resume",
        extra_state=resumed_teacher,
    )
    for a, b in ((straight, resumed), (straight_teacher.model, resumed_teacher.model)):
        for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
            assert torch.allclose(x, y, atol=1e-6), name
    assert resumed_teacher.beta == pytest.approx(straight_teacher.beta)
