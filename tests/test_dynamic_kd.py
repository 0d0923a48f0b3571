"""Dynamic KD (docs/methods.md §2): each weighting and selection rule on a batch of four, against hand-computed
values."""

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from kdpipe.core.store import KdpipeError
from kdpipe.methods.base import DistillContext
from kdpipe.methods.dynamic_choices import DATA_STRATEGIES
from kdpipe.methods.dynamic_kd import (
    build_data,
    build_objective,
    build_teacher,
    kd_distance,
    normalized_entropy,
    normalized_hidden_mse,
    objective_weights,
    select_top,
    selection_scores,
    teacher_weights,
)
from kdpipe.signals.load import TokenFeature
from tests.conftest import method_args

# Student probabilities of a batch of four, from uncertain to confident. ĥ = H(p) / log 3, by hand:
# row 0: log 3 / log 3 = 1; row 1: (0.5 ln 2 + 0.5 ln 4) / ln 3 = 1.03972 / 1.09861 = 0.94640;
# row 2: (0.8 ln 1.25 + 0.2 ln 10) / ln 3 = 0.63903 / 1.09861 = 0.58167;
# row 3: (0.98 ln(1/0.98) + 0.02 ln 100) / ln 3 = 0.11190 / 1.09861 = 0.10185.
P = np.array([[1 / 3, 1 / 3, 1 / 3], [0.5, 0.25, 0.25], [0.8, 0.1, 0.1], [0.98, 0.01, 0.01]])
H = np.array([1.0, 0.94640, 0.58167, 0.10185])
Z = torch.tensor(np.log(P), dtype=torch.float32)
# Teachers: the student's logits shifted by a per-row constant c, so the logit MSE is exactly c².
D_SMALL = np.array([1.0, 4.0, 9.0, 16.0])  # shifts 1, 2, 3, 4
D_LARGE = np.array([0.0, 1.0, 0.0, 4.0])  # shifts 0, 1, 0, 2
SMALL = Z + torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]
LARGE = Z + torch.tensor([0.0, 1.0, 0.0, 2.0])[:, None]
Y = torch.tensor([0, 0, 0, 1])
CE = -np.log(P[[0, 1, 2, 3], [0, 0, 0, 1]]).mean()


def test_normalized_entropy_by_hand():
    assert np.allclose(normalized_entropy(Z).numpy(), H, atol=1e-4)


def test_mse_distance_is_the_mean_squared_logit_gap():
    assert np.allclose(kd_distance(Z, SMALL, "mse", 5.0).numpy(), D_SMALL)
    # KL of identical distributions (a constant shift leaves the softmax unchanged) is 0.
    assert np.allclose(kd_distance(Z, SMALL, "kl", 5.0).numpy(), 0.0, atol=1e-5)
    # T = 2: teacher softmax(ln 9 / 2, 0) = (0.75, 0.25) against uniform: T²·(0.75 ln 1.5 + 0.25 ln 0.5) = 4·0.130812.
    kl = kd_distance(torch.zeros(1, 2), torch.tensor([[math.log(9.0), 0.0]]), "kl", 2.0)
    assert kl.item() == pytest.approx(4 * 0.130812, rel=1e-4)


@pytest.mark.parametrize(
    "mode, direction, expected",
    [
        # hard: rows 0, 1 (most uncertain) -> small teacher, rows 2, 3 -> large; each half contributes its own mean.
        ("hard", "uncertain_to_small", (1 + 4) / 2 + (0 + 4) / 2),
        ("hard", "uncertain_to_large", (0 + 1) / 2 + (9 + 16) / 2),
        # soft: w_S = mean ĥ over the batch.
        ("soft", "uncertain_to_small", H.mean() * D_SMALL.mean() + (1 - H.mean()) * D_LARGE.mean()),
        ("soft_instance", "uncertain_to_small", (H * D_SMALL + (1 - H) * D_LARGE).mean()),
        ("soft_instance", "uncertain_to_large", ((1 - H) * D_SMALL + H * D_LARGE).mean()),
    ],
)
def test_teacher_weighting_rules(mode, direction, expected):
    w_small, w_large = teacher_weights(normalized_entropy(Z), mode, direction)
    kd = (w_small * torch.tensor(D_SMALL) + w_large * torch.tensor(D_LARGE)).mean().item()
    assert kd == pytest.approx(expected, rel=1e-4)


def test_hard_split_of_an_odd_batch_gives_the_extra_row_to_the_large_teacher():
    w_small, w_large = teacher_weights(torch.tensor([0.9, 0.1, 0.5]), "hard")
    assert w_small.tolist() == [3.0, 0.0, 0.0] and w_large.tolist() == [0.0, 1.5, 1.5]


# Selection batch: the scores disagree. Entropy order B, A, C, D; margin order A (0), B (0.1), C, D;
# confidence order B (0.40), A (0.45), C, D.
P_SEL = np.array([[0.45, 0.45, 0.10], [0.40, 0.30, 0.30], [0.80, 0.10, 0.10], [0.98, 0.01, 0.01]])
Z_SEL = torch.tensor(np.log(P_SEL), dtype=torch.float32)


@pytest.mark.parametrize(
    "strategy, ratio, kept",
    [
        ("entropy", 0.25, [1]),
        ("margin", 0.25, [0]),
        ("confidence", 0.25, [1]),
        ("entropy", 0.5, [1, 0]),
        ("margin", 0.5, [0, 1]),
        ("entropy-r", 0.25, [3]),
        ("margin-r", 0.5, [3, 2]),
        ("confidence-r", 0.75, [3, 2, 0]),
        ("entropy", 1.0, [1, 0, 2, 3]),
        ("entropy", 0.1, []),
    ],
)
def test_selection_rules(strategy, ratio, kept):
    assert select_top(selection_scores(Z_SEL, strategy), ratio).tolist() == kept


def test_random_selection_follows_the_generator():
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a = select_top(selection_scores(Z_SEL, "random", g1), 0.5)
    assert a.tolist() == select_top(selection_scores(Z_SEL, "random", g2), 0.5).tolist() and len(a) == 2


def test_bad_arguments_are_refused():
    """A choice outside its list is refused by the registry, where every method_args is checked when the DAG is
    built; the ratio's range by the method."""
    for method, bad in (
        ("dynamic_data", {"strategy": "lc"}),
        ("dynamic_teacher", {"mode": "medium"}),
        ("dynamic_teacher", {"direction": "sideways"}),
        ("dynamic_objective", {"strategy": "lc"}),
        ("dynamic_data", {"distance": "l1"}),
    ):
        ((key, value),) = bad.items()
        with pytest.raises(KdpipeError, match=rf"^method_args of {method}\.{key}: '{value}'; choose one of "):
            method_args(method, bad)
    with pytest.raises(KdpipeError, match=r"ratio must be in \(0, 1\]"):
        select_top(torch.zeros(4), 0.0)


def test_normalized_hidden_mse_by_hand():
    # Token 0: n(s) = (1, 0), n(t) = (0, 1) -> squared gap (1, 1), mean 1; token 1 equal -> 0.
    s = torch.tensor([[[3.0, 0.0], [0.0, 2.0]]])
    t = torch.tensor([[[0.0, 5.0], [0.0, 1.0]]])
    assert normalized_hidden_mse(s, t, torch.tensor([[1.0, 1.0]])).item() == pytest.approx(0.5)
    assert normalized_hidden_mse(s, t, torch.tensor([[1.0, 0.0]])).item() == pytest.approx(1.0)  # padding ignored


def test_objective_weights():
    h = torch.tensor(H)
    w_logit, w_rep = objective_weights(h, "uncertainty")
    assert np.allclose(w_logit, 1 - H) and np.allclose(w_rep, H)
    w_logit, w_rep = objective_weights(h, "uncertainty-r")
    assert np.allclose(w_logit, H) and np.allclose(w_rep, 1 - H)
    assert objective_weights(h, "none")[0].tolist() == [1.0] * 4


# ---- the builders' losses with a fixed-output model ----------------------------------------------------------


class FixedLogits(nn.Module):
    """A 'student' whose logits are a parameter, with optional fixed hidden states."""

    def __init__(self, z, hidden=None):
        super().__init__()
        self.z = nn.Parameter(z.clone())
        self.hidden = hidden
        self.config = SimpleNamespace(hidden_size=None if hidden is None else hidden[0].shape[-1])

    def forward(self, output_hidden_states=False, **inputs):
        return SimpleNamespace(logits=self.z, hidden_states=self.hidden)


def context(teachers: dict, **kw) -> DistillContext:
    labels = ["a", "b", "c"]
    signals = {t: {"logits": z} for t, z in teachers.items()}
    signals.update(kw.pop("extra_signals", {}))
    return DistillContext(
        labels=labels,
        teachers=list(teachers),
        blocks={t: np.arange(3) for t in teachers},
        signals=signals,
        device=torch.device("cpu"),
        **kw,
    )


def batch(n=4, width=2):
    return {
        "input_ids": torch.zeros(n, width, dtype=torch.long),
        "attention_mask": torch.ones(n, width, dtype=torch.long),
        "index": torch.arange(n),
        "labels": Y[:n],
    }


def test_dynamic_teacher_loss_is_ce_plus_weighted_kd():
    ctx = context({"large": LARGE, "small": SMALL})
    objective = build_teacher(ctx, method_args("dynamic_teacher", {"mode": "hard", "small_teacher": "small"}))
    loss, terms = objective.loss(FixedLogits(Z), batch())
    assert terms["kd"] == pytest.approx(4.5, rel=1e-5)
    assert loss.item() == pytest.approx(CE + 4.5, rel=1e-5)


def test_entropy_gradient_is_an_option():
    ctx = context({"large": LARGE, "small": SMALL})
    grads = {}
    for grad in (False, True):
        model = FixedLogits(Z)
        loss, _ = build_teacher(
            ctx,
            method_args("dynamic_teacher", {"mode": "soft_instance", "small_teacher": "small", "entropy_grad": grad}),
        ).loss(model, batch())
        loss.backward()
        grads[grad] = model.z.grad.clone()
    # Detached: the gradient of CE + mean(ĥ·D_small + (1 − ĥ)·D_large) with ĥ a constant.
    z = Z.clone().requires_grad_(True)
    h = torch.tensor(H, dtype=torch.float32)
    manual = (
        torch.nn.functional.cross_entropy(z, Y)
        + (h * ((z - SMALL) ** 2).mean(-1) + (1 - h) * ((z - LARGE) ** 2).mean(-1)).mean()
    )
    manual.backward()
    assert torch.allclose(grads[False], z.grad, atol=1e-3)
    assert not torch.allclose(grads[False], grads[True], atol=1e-3)


def test_dynamic_teacher_needs_two_teachers_and_the_small_one_named():
    with pytest.raises(KdpipeError, match="small_teacher naming the smaller one"):
        build_teacher(context({"large": LARGE, "small": SMALL}), method_args("dynamic_teacher", {}))
    with pytest.raises(KdpipeError, match="unknown key 'ratio'"):
        build_teacher(
            context({"large": LARGE, "small": SMALL}),
            method_args("dynamic_teacher", {"small_teacher": "small", "ratio": 0.5}),
        )


def test_dynamic_data_loss_is_ce_on_all_plus_kd_on_kept_rows():
    teacher = Z_SEL + torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]  # D = 1, 4, 9, 16
    objective = build_data(context({"t": teacher}), method_args("dynamic_data", {"strategy": "margin", "ratio": 0.5}))
    loss, terms = objective.loss(FixedLogits(Z_SEL), batch())
    ce = -np.log(P_SEL[[0, 1, 2, 3], [0, 0, 0, 1]]).mean()
    assert terms["kept"] == 2 and terms["kd"] == pytest.approx((1 + 4) / 2)  # rows A, B
    assert loss.item() == pytest.approx(ce + 2.5, rel=1e-5)


def test_dynamic_objective_loss_by_hand():
    # One hidden-state pair (student state 0 with teacher state 0); R_i by hand: rows 0 and 2 differ on token 0
    # (squared gap mean 1 over 2 real tokens -> 0.5), rows 1 and 3 are equal (0).
    s = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]).repeat(4, 1, 1)
    t = s.clone()
    t[[0, 2], 0] = torch.tensor([0.0, 1.0])
    r = np.array([0.5, 0.0, 0.5, 0.0])
    teacher = Z + torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]  # D = 1, 4, 9, 16
    ctx = context(
        {"t": teacher},
        extra_signals={
            "t": {
                "logits": teacher,
                "hidden": TokenFeature.packed(  # 4 rows of 2 tokens, one layer of 2 floats: [8, 1, 2] packed
                    "hidden", t.reshape(8, 1, 2).numpy().astype(np.float16), [2, 2, 2, 2], [0], hidden_size=2, heads=1
                ),
            }
        },
        train_lengths=np.array([2, 2, 2, 2]),
        alignment={"t": [[0, 0]]},
        student_config=SimpleNamespace(hidden_size=2),
    )
    loss, terms = build_objective(ctx, method_args("dynamic_objective", {})).loss(FixedLogits(Z, hidden=(s,)), batch())
    assert terms["kd"] == pytest.approx(((1 - H) * D_SMALL).mean(), rel=1e-4)
    assert terms["rep"] == pytest.approx((H * r).mean(), rel=1e-4)
    assert loss.item() == pytest.approx(CE + ((1 - H) * D_SMALL).mean() + (H * r).mean(), rel=1e-4)
    assert math.isfinite(loss.item())


# ---- every documented strategy of dynamic_data -----------------------------------------------------------------


def documented_strategies() -> list[str]:
    """The strategies docs/methods.md §2b names in its "Strategies:" sentence."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "methods.md").read_text()
    section = doc.split("### §2b")[1].split("\n### ")[0]
    sentence = section.split("Strategies:")[1].split(". ")[0]
    return re.findall(r"`([a-z]+(?:-r)?)`", sentence)


def test_the_documented_strategies_are_the_declared_ones():
    assert sorted(documented_strategies()) == sorted(DATA_STRATEGIES)


@pytest.mark.parametrize("strategy", documented_strategies())
def test_every_documented_strategy_is_accepted_and_trains_a_step(strategy):
    teacher = Z_SEL + torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]
    objective = build_data(context({"t": teacher}), method_args("dynamic_data", {"strategy": strategy}))
    model = FixedLogits(Z_SEL)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss, terms = objective.loss(model, batch())
    loss.backward()
    optimizer.step()
    assert terms["kept"] == 2 and math.isfinite(loss.item())  # ratio 0.5 of a batch of four
    assert not torch.equal(model.z.detach(), Z_SEL)


def test_with_ce_weight_zero_no_dynamic_kd_method_reads_the_gold_labels():
    """``ce_weight: 0`` leaves the CE out of the loss and the batch's labels unread (the student is then not
    recorded as trained on them, docs/report.md, "Which gold labels each model read"); the loss is the rest."""
    from kdpipe.training.loop import LabelWatch

    teacher = Z + torch.tensor([1.0, 2.0, 3.0, 4.0])[:, None]
    cases = {
        "dynamic_teacher": (build_teacher, context({"large": LARGE, "small": SMALL}), {"small_teacher": "small"}),
        "dynamic_data": (build_data, context({"t": teacher}), {"strategy": "margin", "ratio": 0.5}),
    }
    for name, (builder, ctx, args) in cases.items():
        for weight in (0.0, 1.0):
            watched = LabelWatch(batch())
            loss, terms = builder(ctx, method_args(name, {**args, "ce_weight": weight})).loss(FixedLogits(Z), watched)
            assert watched.read_labels is bool(weight) and ("ce" in terms) is bool(weight), (name, weight)
            if not weight:  # kd_weight 1: the loss is the KD term alone
                assert loss.item() == pytest.approx(terms["kd"], rel=1e-5)
