"""Vanilla KD (MUKI's VKD, docs/methods.md §1) against hand-computed values."""

import math

import pytest
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.methods.losses import kl_divergence, union_logits, vanilla_kd_loss


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
