"""UHC (MUKI's block-renormalised baseline, docs/methods.md §1) against hand-computed values."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from kdpipe.methods.base import DistillContext
from kdpipe.methods.uhc import block_renormalised_log_probs, build, uhc_loss
from tests.conftest import method_args

LN2, LN3 = math.log(2), math.log(3)
BLOCKS = [torch.tensor([0, 1]), torch.tensor([2, 3])]
# batch of two over four student classes; teacher A covers classes 0,1 and teacher B classes 2,3
STUDENT = [[0.0, LN2, 0.0, LN3], [LN3, 0.0, LN2, LN2]]
TEACHER_A = [[0.0, 0.0], [LN3, 0.0]]
TEACHER_B = [[LN3, 0.0], [0.0, LN2]]


def softmax(xs):
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def kl(a, b):
    return sum(ai * math.log(ai / bi) for ai, bi in zip(a, b) if ai > 0)


def hand_uhc(student, teachers, blocks, t):
    """T² Σ_k KL(softmax(z_k/T) ‖ q_s[block]/Σ q_s[block]) from the full student softmax, batch mean."""
    total = 0.0
    for i, zs in enumerate(student):
        q_s = softmax([z / t for z in zs])
        for z_k, block in zip(teachers, blocks):
            renorm = [q_s[c] for c in block]
            renorm = [v / sum(renorm) for v in renorm]
            total += kl(softmax([z / t for z in z_k[i]]), renorm)
    return t * t * total / len(student)


def test_block_renormalisation_on_a_concrete_case():
    # row 1: block [0,1] has exp-logits (1, 2) -> (1/3, 2/3); block [2,3] has (1, 3) -> (1/4, 3/4)
    z = torch.tensor(STUDENT)
    a = block_renormalised_log_probs(z, BLOCKS[0], 1.0).exp()
    b = block_renormalised_log_probs(z, BLOCKS[1], 1.0).exp()
    assert a[0].tolist() == pytest.approx([1 / 3, 2 / 3])
    assert b[0].tolist() == pytest.approx([1 / 4, 3 / 4])
    # row 2: (3, 1) -> (3/4, 1/4) and (2, 2) -> (1/2, 1/2)
    assert a[1].tolist() == pytest.approx([3 / 4, 1 / 4])
    assert b[1].tolist() == pytest.approx([1 / 2, 1 / 2])


def test_block_renormalisation_follows_the_block_order_and_is_stable():
    # block [3, 1]: teacher-local order is (class 3, class 1); exp-logits (3, 2) -> (3/5, 2/5)
    z = torch.tensor([[0.0, LN2, 0.0, LN3]])
    assert block_renormalised_log_probs(z, torch.tensor([3, 1]), 1.0).exp()[0].tolist() == pytest.approx([0.6, 0.4])
    # logits far outside exp's range: a naive log(q[block]/Σ q[block]) would give nan; the tolerance is float32's
    # spacing near 1000 (6e-5), which limits how exactly 1000 + ln3 is stored
    big = torch.tensor([[1000.0, 1000.0 + LN3, -1000.0, 0.0]])
    out = block_renormalised_log_probs(big, BLOCKS[0], 1.0).exp()[0].tolist()
    assert out == pytest.approx([0.25, 0.75], abs=1e-4)


def test_uhc_loss_at_t1_by_hand():
    # row 1: A: KL((1/2,1/2) ‖ (1/3,2/3)) = ½ln(3/2) + ½ln(3/4) = ½ln(9/8)
    #        B: KL((3/4,1/4) ‖ (1/4,3/4)) = ¾ln3 − ¼ln3 = ½ln3
    # row 2: A: KL((3/4,1/4) ‖ (3/4,1/4)) = 0
    #        B: KL((1/3,2/3) ‖ (1/2,1/2)) = ⅓ln(2/3) + ⅔ln(4/3)
    expected = (0.5 * math.log(9 / 8) + 0.5 * LN3 + math.log(2 / 3) / 3 + 2 * math.log(4 / 3) / 3) / 2
    got = uhc_loss(torch.tensor(STUDENT), [torch.tensor(TEACHER_A), torch.tensor(TEACHER_B)], BLOCKS, 1.0)
    assert got.item() == pytest.approx(expected, rel=1e-6)
    assert expected == pytest.approx(hand_uhc(STUDENT, [TEACHER_A, TEACHER_B], [[0, 1], [2, 3]], 1.0))


def test_uhc_loss_at_t2_by_hand():
    # at T=2 every logit is halved and the sum of KLs is scaled by T² = 4
    expected = hand_uhc(STUDENT, [TEACHER_A, TEACHER_B], [[0, 1], [2, 3]], 2.0)
    # row 2 block A still matches exactly (same logits): its term stays 0 at any T
    got = uhc_loss(torch.tensor(STUDENT), [torch.tensor(TEACHER_A), torch.tensor(TEACHER_B)], BLOCKS, 2.0)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_uhc_loss_is_zero_when_the_student_blocks_match_the_teachers():
    # teachers' logits are the student's block logits up to a per-block shift (softmax is shift-invariant);
    # the student's blocks have different total masses, which renormalisation removes
    z = torch.tensor(STUDENT)
    teachers = [z[:, BLOCKS[0]] + 5.0, z[:, BLOCKS[1]] - 2.0]
    for t in (1.0, 2.0):
        assert uhc_loss(z, teachers, BLOCKS, t).item() == pytest.approx(0.0, abs=1e-6)


class LookupStudent(nn.Module):
    """A stub student: the logits of row ``input_ids[:, 0]`` of a fixed table."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(torch.tensor(table))

    def forward(self, input_ids, **_):
        return SimpleNamespace(logits=self.table[input_ids[:, 0]])


def test_build_indexes_train_rows_and_matches_uhc_loss():
    # three train rows; teacher B covers classes (3, 2) in that local order
    logits_a = torch.tensor([[0.0, 1.0], [LN3, 0.0], [2.0, -1.0]])
    logits_b = torch.tensor([[0.5, 0.0], [0.0, LN2], [1.0, 1.0]])
    ctx = DistillContext(
        labels=["a", "b", "c", "d"],
        teachers=["A", "B"],
        blocks={"A": np.array([0, 1]), "B": np.array([3, 2])},
        signals={"A": {"logits": logits_a}, "B": {"logits": logits_b}},
        device=torch.device("cpu"),
    )
    objective = build(ctx, method_args("uhc", {"temperature": 2.0}))
    model = LookupStudent(STUDENT)
    batch = {"input_ids": torch.tensor([[1], [0]]), "index": torch.tensor([2, 0])}
    loss, terms = objective.loss(model, batch)
    z = torch.tensor(STUDENT)[[1, 0]]
    index = torch.tensor([2, 0])
    expected = uhc_loss(z, [logits_a[index], logits_b[index]], [torch.tensor([0, 1]), torch.tensor([3, 2])], 2.0)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert terms == {"kd": pytest.approx(expected.item(), rel=1e-6)}
    # the hand value with B's block in (3, 2) order; rel 1e-5 because the tensors hold ln2, ln3 in float32
    rows = [STUDENT[1], STUDENT[0]]
    teachers = [[[2.0, -1.0], [0.0, 1.0]], [[1.0, 1.0], [0.5, 0.0]]]
    assert loss.item() == pytest.approx(hand_uhc(rows, teachers, [[0, 1], [3, 2]], 2.0), rel=1e-5)
    loss.backward()
    assert model.table.grad is not None and model.table.grad[[0, 1]].abs().sum() > 0
    assert objective.extra_modules == {}
