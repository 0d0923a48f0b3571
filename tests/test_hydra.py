"""Hydra / Hydra+ (docs/methods.md §3) losses against hand-computed values, and the objective on a tiny multi-head
BERT."""

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from kdpipe.core.store import KdpipeError
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.methods.base import DistillContext
from kdpipe.methods.hydra import (
    aggregation_loss,
    build,
    build_hydra,
    correctness_loss,
    diversity_loss,
    individuality_loss,
    lambda_at,
)
from kdpipe.methods.registry import METHODS
from kdpipe.models.loading import load_classifier
from kdpipe.models.multihead import make_multihead
from tests.conftest import method_args

LN2, LN3 = math.log(2), math.log(3)


def softmax(xs, temp=1.0):
    e = [math.exp(x / temp) for x in xs]
    return [v / sum(e) for v in e]


def kl(a, b):
    return sum(ai * math.log(ai / bi) for ai, bi in zip(a, b) if ai > 0)


def test_correctness_loss_by_hand():
    # head 0: uniform (y=0: ln 3), (½,¼,¼) (y=1: ln 4); head 1: (⅗,⅕,⅕) (y=0: ln 5/3), (⅕,⅖,⅖) (y=1: ln 5/2)
    heads = torch.tensor([[[0.0, 0.0, 0.0], [LN2, 0.0, 0.0]], [[LN3, 0.0, 0.0], [0.0, LN2, LN2]]])
    got = correctness_loss(heads, torch.tensor([0, 1]))
    # (1/M) Σ_m batch-mean CE = (ln 3 + ln 4 + ln 5/3 + ln 5/2) / 4 = ln 50 / 4
    assert got.item() == pytest.approx(math.log(50) / 4, rel=1e-6)


def test_aggregation_loss_closed_form_at_t1():
    # members (⅗,⅕,⅕) and (⅕,⅖,⅖): mean (⅖, 3/10, 3/10); both heads uniform: mean uniform
    members = torch.tensor([[[LN3, 0.0, 0.0]], [[0.0, LN2, LN2]]])
    heads = torch.zeros(2, 1, 3)
    expected = 0.4 * math.log(0.4 * 3) + 0.6 * math.log(0.3 * 3)
    assert expected == pytest.approx(0.0097123, abs=1e-7)
    assert aggregation_loss(members, heads, 1.0).item() == pytest.approx(expected, abs=1e-7)


MEMBERS = [
    [[1.0, 0.0, -1.0], [0.5, 2.0, 0.0]],  # member 0: rows 0, 1
    [[0.0, 3.0, 0.0], [1.0, 1.0, 1.0]],  # member 1
    [[-2.0, 0.0, 2.0], [0.0, 0.0, 4.0]],  # member 2
    [[0.3, 0.1, 0.2], [2.0, -1.0, 0.0]],
]  # member 3
HEADS = [
    [[0.5, 0.0, 0.0], [0.0, 1.0, 0.0]],  # head 0
    [[0.0, 0.0, 1.5], [1.0, 0.0, -1.0]],
]  # head 1


def test_aggregation_loss_four_members_two_heads_at_t2():
    temp = 2.0
    expected = 0.0
    for row in range(2):
        q = np.mean([softmax(MEMBERS[n][row], temp) for n in range(4)], axis=0)
        p = np.mean([softmax(HEADS[m][row], temp) for m in range(2)], axis=0)
        expected += kl(q, p)
    expected = temp**2 * expected / 2
    got = aggregation_loss(torch.tensor(MEMBERS), torch.tensor(HEADS), temp)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_individuality_loss_matches_head_m_with_members_m_plus_k_times_m():
    temp = 3.0
    # N = 4, M = 2: head 0 <- members 0 and 2, head 1 <- members 1 and 3
    pairs = [(0, 0), (1, 1), (2, 0), (3, 1)]
    expected = (
        sum(kl(softmax(MEMBERS[n][row], temp), softmax(HEADS[m][row], temp)) for n, m in pairs for row in range(2)) / 2
    )
    expected *= temp**2 / 4
    got = individuality_loss(torch.tensor(MEMBERS), torch.tensor(HEADS), temp)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # a blockwise matching (head 0 <- members 0, 1) gives another value
    wrong = (
        sum(
            kl(softmax(MEMBERS[n][row], temp), softmax(HEADS[m][row], temp))
            for n, m in [(0, 0), (1, 0), (2, 1), (3, 1)]
            for row in range(2)
        )
        / 2
        * temp**2
        / 4
    )
    assert abs(wrong - expected) > 1e-3


def test_individuality_loss_with_more_heads_than_members():
    # N = 1, M = 2: j < 2, both heads are matched to member 0
    members = torch.tensor(MEMBERS[:1])
    expected = sum(kl(softmax(MEMBERS[0][row]), softmax(HEADS[m][row])) for m in range(2) for row in range(2)) / 2
    assert individuality_loss(members, torch.tensor(HEADS), 1.0).item() == pytest.approx(expected / 2, rel=1e-6)


def two_layer_head(seed):
    torch.manual_seed(seed)
    head = nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 4))
    with torch.no_grad():
        for linear in head:
            linear.bias.uniform_(0.5, 1.0)  # non-zero biases
    return [m for m in head if isinstance(m, nn.Linear)]


def test_diversity_of_identical_heads_is_the_maximum():
    head = two_layer_head(0)
    # every row and bias element agrees with the mean: (2 + 2 + 4 + 4) terms of 1, per head, M = 2
    assert diversity_loss([head, copy.deepcopy(head)]).item() == pytest.approx(24.0, rel=1e-6)


def test_diversity_of_opposite_heads_has_a_zero_mean_head():
    head = two_layer_head(0)
    other = copy.deepcopy(head)
    with torch.no_grad():
        for linear in other:
            linear.weight.neg_()
            linear.bias.neg_()
    # the mean head is 0, so every cosine is 0 (eps) and sign(0) = 0: ½ per term, 24 terms
    assert diversity_loss([head, other]).item() == pytest.approx(12.0, rel=1e-6)


def test_diversity_by_hand():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    with torch.no_grad():
        a.weight.copy_(torch.tensor([[1.0, 0.0], [1.0, 1.0]]))
        b.weight.copy_(torch.tensor([[0.0, 1.0], [1.0, 1.0]]))
        a.bias.copy_(torch.tensor([1.0, -1.0]))
        b.bias.copy_(torch.tensor([1.0, 2.0]))
    # weight rows: mean row 0 = (½, ½), cos with (1,0) and (0,1) = 1/√2 -> 2·(1 + 1/√2)/2; row 1 equal -> 2·1
    # biases: mean (1, ½); a: signs (+, −) -> 1 + 0; b: (+, +) -> 1 + 1
    expected = (1 + 1 / math.sqrt(2)) + 2 + 3
    loss = diversity_loss([[a], [b]])
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # the sign-agreement of biases has no gradient; the differing weight rows do
    assert a.bias.grad.abs().sum() == 0 and b.bias.grad.abs().sum() == 0
    assert a.weight.grad[0].abs().sum() > 0
    with torch.no_grad():
        for linear in (a, b):
            linear.weight -= 0.1 * linear.weight.grad
    assert diversity_loss([[a], [b]]).item() < expected


def test_lambda_schedule():
    assert lambda_at(0, 0.5, None) == 0.5 and lambda_at(99, 0.5, None) == 0.5
    ramp = [20, 150]
    assert [lambda_at(e, 0.1, ramp) for e in (0, 20, 85, 150, 200)] == pytest.approx([0, 0, 0.05, 0.1, 0.1])
    for bad in ([5, 5], [10, 2], [-1, 3], [1, 2, 3]):
        with pytest.raises(KdpipeError, match="diversity_ramp"):
            lambda_at(0, 0.1, bad)


# ---- the objective on a tiny multi-head BERT -------------------------------------------------------------------

LABELS = ["a", "b", "c"]
# three members over four train rows, each in its own local class order (block = student class of local class i)
BLOCKS = {"A": [0, 1, 2], "B": [2, 0, 1], "C": [1, 2, 0]}
LOCAL = {
    t: torch.tensor(np.random.default_rng(i).normal(size=(4, 3)), dtype=torch.float32) for i, t in enumerate(BLOCKS)
}
IDS = torch.tensor([[101, 2023, 2003, 102, 0], [101, 7592, 102, 0, 0], [101, 2307, 2154, 2000, 102]])
BATCH = {
    "input_ids": IDS,
    "attention_mask": (IDS > 0).long(),
    "index": torch.tensor([3, 0, 2]),
    "labels": torch.tensor([0, 1, 2]),
}


def student(heads=2):
    return make_multihead(load_classifier("builtin:tiny-bert", LABELS, seed=0), heads=heads, head_layers=1, seed=0)


def make_ctx(model, teachers=("A", "B", "C"), blocks=None):
    blocks = blocks or BLOCKS
    return DistillContext(
        labels=LABELS,
        teachers=list(teachers),
        blocks={t: np.array(blocks[t]) for t in teachers},
        signals={t: {"logits": LOCAL[t]} for t in teachers},
        device=torch.device("cpu"),
        student_config=getattr(model, "config", None),
    )


def placed(teacher, row):
    """A teacher's logits of one train row in the student's label order, by hand: local class i -> block[i]."""
    out = [0.0] * 3
    for i, cls in enumerate(BLOCKS[teacher]):
        out[cls] = LOCAL[teacher][row, i].item()
    return out


def test_build_loss_matches_the_formula_on_hand_placed_members():
    model = student().eval()
    objective = build(make_ctx(model), method_args("hydra_plus", {}))
    loss, terms = objective.loss(model, BATCH)
    members = torch.tensor([[placed(t, row) for row in (3, 0, 2)] for t in BLOCKS])
    with torch.no_grad():
        heads = model(input_ids=IDS, attention_mask=BATCH["attention_mask"]).head_logits
        l1 = correctness_loss(heads, BATCH["labels"])
        l2 = aggregation_loss(members, heads, 1.0)
        l3 = individuality_loss(members, heads, 3.0)
        l4 = diversity_loss(model.head_linears())
    expected = 0.1 * l1 + 0.9 * (0.5 * l2 + 0.5 * l3) + 1e-3 * l4
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert terms == {
        "ce": pytest.approx(l1.item(), rel=1e-5),
        "aggregate": pytest.approx(l2.item(), rel=1e-5),
        "individual": pytest.approx(l3.item(), rel=1e-5),
        "diversity": pytest.approx(l4.item()),
        "lambda": 1e-3,
    }
    assert all(type(v) is float for v in terms.values())


def test_one_training_step_reaches_every_head():
    torch.manual_seed(0)
    model = student()
    objective = build(make_ctx(model), method_args("hydra_plus", {"diversity": 0.1}))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.train()
    loss, _ = objective.loss(model, BATCH)
    loss.backward()

    def reached(module):
        return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())

    assert reached(model.embeddings) and reached(model.core[0])
    for head in model.heads:
        assert reached(head.layers[0]) and reached(head.pooler) and reached(head.classifier)
    optimizer.step()
    after, terms = objective.loss(model, BATCH)
    assert torch.isfinite(after) and all(math.isfinite(v) for v in terms.values())


def test_on_epoch_ramps_lambda():
    model = student().eval()
    objective = build(make_ctx(model), method_args("hydra_plus", {"diversity": 0.1, "diversity_ramp": [1, 3]}))
    assert objective.loss(model, BATCH)[1]["lambda"] == 0.0
    objective.on_epoch(2, 5)
    assert objective.loss(model, BATCH)[1]["lambda"] == pytest.approx(0.05)
    objective.on_epoch(4, 5)
    assert objective.loss(model, BATCH)[1]["lambda"] == pytest.approx(0.1)


def test_plain_hydra_is_the_individuality_loss_only():
    model = student().eval()
    loss, terms = build_hydra(make_ctx(model), method_args("hydra", {"temp_individual": 2.0})).loss(model, BATCH)
    members = torch.tensor([[placed(t, row) for row in (3, 0, 2)] for t in BLOCKS])
    with torch.no_grad():
        heads = model(input_ids=IDS, attention_mask=BATCH["attention_mask"]).head_logits
    assert loss.item() == pytest.approx(individuality_loss(members, heads, 2.0).item(), rel=1e-5)
    assert terms["lambda"] == 0.0 and loss.grad_fn is not None
    with pytest.raises(KdpipeError, match="unknown key 'alpha'; this method knows temp_individual"):
        build_hydra(make_ctx(model), method_args("hydra", {"alpha": 0.5}))


def test_build_refusals():
    model = student(heads=2)
    with pytest.raises(KdpipeError, match="unknown key 'lambda'"):
        build(make_ctx(model), method_args("hydra_plus", {"lambda": 0.1}))
    with pytest.raises(KdpipeError, match="alpha"):
        build(make_ctx(model), method_args("hydra_plus", {"alpha": 1.5}))
    with pytest.raises(KdpipeError, match="diversity_ramp"):
        build(make_ctx(model), method_args("hydra_plus", {"diversity_ramp": [5, 1]}))
    # the ensemble's members must each cover the full label set: the distill stage's class blocks check it
    partial = {t: [LABELS[i] for i in block] for t, block in {**BLOCKS, "C": [0, 1]}.items()}
    with pytest.raises(KdpipeError, match="teacher 'C' covers 2 of the 3 labels, but this method needs teachers"):
        teacher_blocks(partial, LABELS, policy=METHODS["hydra_plus"].teacher_classes, where="hydra")


@pytest.mark.parametrize(
    "heads, message",
    [
        (None, r"^students\.s_hydra_plus: method 'hydra_plus' trains a multi-head student; set model\.heads"),
        (3, r"^students\.s_hydra_plus\.model\.heads\.count: 3 heads for 2 teachers; .* \(M <= N\)$"),
    ],
)
def test_the_plan_refuses_a_student_without_heads_or_with_more_heads_than_members(heads, message):
    """Checked once, when the DAG is built (kdpipe.plan.checks), before any job runs."""
    from tests.test_plan import load

    def edit(config):
        model = config["students"]["s_hydra_plus"]["model"]
        model.pop("heads") if heads is None else model["heads"].update(count=heads)

    with pytest.raises(KdpipeError, match=message):
        load("tests/configs/tiny_full.yaml", edit=edit)


def test_plain_hydra_reads_no_gold_label_and_hydra_plus_does():
    """Plain Hydra's loss (α = 1) gives the correctness term no weight, so it does not read the batch's labels and
    the student is not recorded as trained on them (docs/report.md, "Which gold labels each model read")."""
    from kdpipe.training.loop import LabelWatch

    model = student().eval()
    for objective, reads in (
        (build_hydra(make_ctx(model), method_args("hydra", {})), False),
        (build(make_ctx(model), method_args("hydra_plus", {"alpha": 1.0})), False),
        (build(make_ctx(model), method_args("hydra_plus", {})), True),
    ):
        batch = LabelWatch(BATCH)
        _, terms = objective.loss(model, batch)
        assert batch.read_labels is reads and ("ce" in terms) is reads
