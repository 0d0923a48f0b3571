"""Vanilla KD (MUKI's VKD, docs/methods.md §1) against hand-computed values."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.methods.base import DistillContext
from kdpipe.methods.losses import kl_divergence, union_logits, vanilla_kd_loss
from kdpipe.methods.vanilla_kd import build
from kdpipe.training.loop import LabelWatch
from tests.conftest import method_args

CPU = torch.device("cpu")


def softmax(xs):
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def test_union_logits_places_disjoint_blocks_in_student_order():
    # teacher A covers student classes 2 and 0 (in that local order), teacher B covers class 1
    za, zb = torch.tensor([[5.0, 7.0]]), torch.tensor([[3.0]])
    out = union_logits([za, zb], [torch.tensor([2, 0]), torch.tensor([1])], 3)
    assert out.tolist() == [[7.0, 3.0, 5.0]]


def test_union_logits_averages_teachers_with_the_same_full_label_set():
    za, zb = torch.tensor([[1.0, 2.0]]), torch.tensor([[3.0, 6.0]])
    out = union_logits([za, zb], [torch.tensor([0, 1]), torch.tensor([1, 0])], 2)
    # teacher B's local order is (class 1, class 0): its logits are reordered to (6, 3) before averaging
    assert out.tolist() == [[3.5, 2.5]]


def test_union_logits_refuses_partial_overlap():
    with pytest.raises(KdpipeError, match="disjoint"):
        union_logits([torch.zeros(1, 2), torch.zeros(1, 2)], [torch.tensor([0, 1]), torch.tensor([1, 2])], 3)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_vanilla_kd_loss_matches_hand_computation(temperature):
    # batch of two; union teacher logits and student logits over three classes
    teacher = [[1.0, 0.0, 0.0], [0.0, 2.0, -1.0]]
    student = [[0.0, 0.0, 0.0], [0.5, 0.5, 0.0]]
    expected = 0.0
    for zt, zs in zip(teacher, student):
        q = softmax([z / temperature for z in zt])
        p = softmax([z / temperature for z in zs])
        expected += sum(qi * (math.log(qi) - math.log(pi)) for qi, pi in zip(q, p))
    expected = temperature**2 * expected / 2
    got = vanilla_kd_loss(torch.tensor(student), torch.tensor(teacher), temperature)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    # first row at T=1 by hand: q = (e, 1, 1)/(e+2), p uniform: KL = sum q log q + log 3 = 0.12335
    if temperature == 1.0:
        q = torch.tensor([[math.e, 1.0, 1.0]]) / (math.e + 2)
        kl = kl_divergence(q, torch.log(torch.full((1, 3), 1 / 3)))
        assert kl.item() == pytest.approx(0.12335, abs=1e-4)


def test_kl_divergence_treats_zero_target_mass_as_zero():
    target = torch.tensor([[1.0, 0.0]])
    log_p = torch.log(torch.tensor([[0.5, 0.5]]))
    assert kl_divergence(target, log_p).item() == pytest.approx(math.log(2))


@pytest.mark.parametrize("weight", [0.0, 0.5])
def test_vanilla_kd_adds_the_hard_label_term_only_when_weighted(weight):
    """L = T²·KL + w_hl·CE; with w_hl = 0 the batch's gold labels are not read
    (docs/report.md, "Which gold labels each model read")."""
    # one row, two classes, T = 1: teacher logits (ln 3, 0) give q = (3/4, 1/4); the student's (0, 0) give p = (1/2,
    # 1/2): KL = 3/4 ln(3/2) + 1/4 ln(1/2); CE with the gold class 0 is ln 2
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    ctx = DistillContext(
        ["a", "b"], ["t"], {"t": np.arange(2)}, {"t": {"logits": torch.tensor([[math.log(3), 0.0]])}}, CPU
    )
    objective = build(ctx, method_args("vanilla_kd", {"temperature": 1.0, "hard_label_weight": weight}))
    batch = LabelWatch(index=torch.tensor([0]), labels=torch.tensor([0]))
    loss, terms = objective.loss(lambda **inputs: SimpleNamespace(logits=torch.zeros(1, 2)), batch)
    assert terms["kd"] == pytest.approx(kl, rel=1e-5)
    assert loss.item() == pytest.approx(kl + weight * math.log(2), rel=1e-5)
    assert batch.read_labels is bool(weight) and ("ce" in terms) is bool(weight)
