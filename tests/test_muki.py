"""MUKI (docs/methods.md §1: teacher scores, hard/soft aggregation, margin, loss) against hand-computed values."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from kdpipe.core.store import KdpipeError
from kdpipe.methods.base import DistillContext
from kdpipe.methods.muki import aggregate, build, margin_weights, muki_loss, padded_probs
from kdpipe.routing.certainty import certainty_scores
from kdpipe.routing.certainty import logit_entropy as teacher_scores_from_logits
from tests.conftest import method_args

LN2, LN3 = math.log(2), math.log(3)
BLOCKS = [torch.tensor([0, 1]), torch.tensor([2, 3])]
# batch of two, four student classes; teacher A covers classes 0,1 and teacher B classes 2,3
TEACHER_A = torch.tensor([[LN3, 0.0], [0.0, 0.0]])  # (3/4, 1/4) and (1/2, 1/2)
TEACHER_B = torch.tensor([[0.0, 0.0], [0.0, LN3]])  # (1/2, 1/2) and (1/4, 3/4)
PADDED = [[[3 / 4, 1 / 4, 0, 0], [0, 0, 1 / 2, 1 / 2]], [[1 / 2, 1 / 2, 0, 0], [0, 0, 1 / 4, 3 / 4]]]
SCORES = torch.tensor([[0.6, 0.2], [0.1, 0.7]])
# u of a two-class (3/4, 1/4): 1 − H/ln2 with H = −(¾ln¾ + ¼ln¼) = 0.56234, so u = 0.18872
U_3_1 = 1 - -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / LN2


def kl(a, b):
    return sum(ai * math.log(ai / bi) for ai, bi in zip(a, b) if ai > 0)


def softmax(xs):
    e = [math.exp(x) for x in xs]
    return [v / sum(e) for v in e]


def test_teacher_scores_from_logits_by_hand():
    assert pytest.approx(0.18872, abs=1e-5) == U_3_1
    # uniform has maximal entropy: u = 0
    assert teacher_scores_from_logits(TEACHER_A, 1.0).tolist() == pytest.approx([U_3_1, 0.0], abs=1e-6)
    # at τ = 2 the logits (2ln3, 0) give the same (3/4, 1/4)
    assert teacher_scores_from_logits(torch.tensor([[2 * LN3, 0.0]]), 2.0).item() == pytest.approx(U_3_1, abs=1e-6)
    # three classes (1/2, 1/4, 1/4): H = 1.5 ln2, u = 1 − 1.5ln2/ln3 = 0.05360
    u = teacher_scores_from_logits(torch.tensor([[LN2, 0.0, 0.0]]), 1.0).item()
    assert u == pytest.approx(1 - 1.5 * LN2 / LN3, abs=1e-6)
    # a one-class teacher: log C = 0, taken as fully certain
    assert teacher_scores_from_logits(torch.tensor([[3.0], [-1.0]]), 1.0).tolist() == [1.0, 1.0]


def test_padded_probs_place_each_teacher_in_its_block():
    assert padded_probs([TEACHER_A, TEACHER_B], BLOCKS, 4, 1.0).numpy() == pytest.approx(np.array(PADDED))
    # a block listed out of order: local class 0 goes to student class 3
    out = padded_probs([torch.tensor([[LN3, 0.0]])], [torch.tensor([3, 2])], 4, 1.0)
    assert out[0, 0].tolist() == pytest.approx([0, 0, 1 / 4, 3 / 4])


def test_hard_aggregation_takes_the_best_scored_teacher():
    q = aggregate(torch.tensor(PADDED), SCORES, "hard", 0.2)
    # row 1: 0.6 > 0.2 -> teacher A; row 2: 0.7 > 0.1 -> teacher B
    assert q.numpy() == pytest.approx(np.array([PADDED[0][0], PADDED[1][1]]))


def test_hard_picks_the_higher_score_even_when_its_distribution_is_worse():
    # teacher A is uniform over its block, teacher B is nearly one-hot, but A's (MC) score is higher
    padded = torch.tensor([[[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.99, 0.01]]])
    q = aggregate(padded, torch.tensor([[0.9, 0.3]]), "hard", 0.2)
    assert q[0].tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0])
    # a tie goes to the first teacher
    q = aggregate(padded, torch.tensor([[0.4, 0.4]]), "hard", 0.2)
    assert q[0].tolist() == pytest.approx([0.5, 0.5, 0.0, 0.0])


def test_soft_aggregation_weights_are_softmax_of_scores_over_tau_s():
    q = aggregate(torch.tensor(PADDED), SCORES, "soft", 0.2)
    # row 1: softmax([0.6, 0.2] / 0.2) = softmax([3, 1]) = (e³, e)/(e³ + e) = (0.88080, 0.11920)
    a1 = math.exp(3) / (math.exp(3) + math.exp(1))
    assert a1 == pytest.approx(0.88080, abs=1e-5)
    # row 2: softmax([0.1, 0.7] / 0.2) = softmax([0.5, 3.5]) = (0.04743, 0.95257)
    a2 = math.exp(0.5) / (math.exp(0.5) + math.exp(3.5))
    assert a2 == pytest.approx(0.04743, abs=1e-5)
    assert q[0].tolist() == pytest.approx([0.75 * a1, 0.25 * a1, 0.5 * (1 - a1), 0.5 * (1 - a1)])
    assert q[1].tolist() == pytest.approx([0.5 * a2, 0.5 * a2, 0.25 * (1 - a2), 0.75 * (1 - a2)])
    assert q.sum(-1).tolist() == pytest.approx([1.0, 1.0])


def test_margin_weights_are_the_gap_between_the_top_two_scores():
    # |0.6 − 0.2| + 1e-6 and |0.7 − 0.1| + 1e-6
    assert margin_weights(SCORES).tolist() == pytest.approx([0.4 + 1e-6, 0.6 + 1e-6], rel=1e-6)
    # three teachers: the two best (0.9, 0.7), not max − min
    assert margin_weights(torch.tensor([[0.9, 0.2, 0.7]])).tolist() == pytest.approx([0.2 + 1e-6], rel=1e-6)
    # equal scores still give a positive weight; one teacher gives 1
    assert margin_weights(torch.tensor([[0.5, 0.5]])).tolist() == pytest.approx([1e-6], rel=1e-3)
    assert margin_weights(torch.tensor([[0.3], [0.8]])).tolist() == [1.0, 1.0]


# student: row 1 uniform, row 2 logits (ln2, 0, 0, ln2) -> (1/3, 1/6, 1/6, 1/3)
STUDENT = torch.tensor([[0.0, 0.0, 0.0, 0.0], [LN2, 0.0, 0.0, LN2]])
# hard targets: row 1 (3/4, 1/4, 0, 0), row 2 (0, 0, 1/4, 3/4)
KL1 = 0.75 * LN3  # ¾ln(¾/¼) + ¼ln(¼/¼)
KL2 = 0.25 * math.log(3 / 2) + 0.75 * math.log(9 / 4)  # ¼ln(¼/⅙) + ¾ln(¾/⅓)
M1, M2 = 0.4 + 1e-6, 0.6 + 1e-6


def test_muki_loss_with_and_without_margin_by_hand():
    q = aggregate(torch.tensor(PADDED), SCORES, "hard", 0.2)
    m = margin_weights(SCORES)
    assert muki_loss(STUDENT, q, m, 1.0).item() == pytest.approx((M1 * KL1 + M2 * KL2) / 2, rel=1e-5)
    assert muki_loss(STUDENT, q, None, 1.0).item() == pytest.approx((KL1 + KL2) / 2, rel=1e-5)


def test_muki_loss_soft_at_tau_2_has_no_t_squared_factor():
    q = aggregate(torch.tensor(PADDED), SCORES, "soft", 0.2)
    expected = sum(kl(q[i].tolist(), softmax([z / 2 for z in STUDENT[i].tolist()])) for i in range(2)) / 2
    assert muki_loss(STUDENT, q, None, 2.0).item() == pytest.approx(expected, rel=1e-5)


class LookupStudent(nn.Module):
    """A stub student: the logits of row ``input_ids[:, 0]`` of a fixed table."""

    def __init__(self, table):
        super().__init__()
        self.table = nn.Parameter(table.clone())

    def forward(self, input_ids, **_):
        return SimpleNamespace(logits=self.table[input_ids[:, 0]])


# three train rows; teacher B's local classes are student classes (3, 2) in that order
LOGITS_A = torch.tensor([[LN3, 0.0], [0.0, 0.0], [0.0, LN3]])  # (¾,¼), (½,½), (¼,¾)
LOGITS_B = torch.tensor([[0.0, 0.0], [1.0, 0.0], [LN3, 0.0]])  # on classes (3,2): (½,½), ·, (¾,¼)
CERTAINTY_A = torch.tensor([0.6, 0.5, 0.1])
CERTAINTY_B = torch.tensor([0.2, 0.5, 0.7])
BATCH = {"input_ids": torch.tensor([[1], [0]]), "index": torch.tensor([2, 0])}


def make_ctx(mc: bool, **route) -> DistillContext:
    """Teachers A and B on three train rows; the route's scores are the MC certainties (the default route) or,
    without MC, MUKI's no_mc score of the logits at τ = 1 (muki_no_mc's route); ``route`` overrides its keys."""
    signals = {"A": {"logits": LOGITS_A}, "B": {"logits": LOGITS_B}}
    if mc:
        scores = torch.stack([CERTAINTY_A, CERTAINTY_B], -1)
    else:
        scores = torch.stack([certainty_scores("logit_entropy", logits=z.numpy()) for z in (LOGITS_A, LOGITS_B)], -1)
    return DistillContext(
        labels=["a", "b", "c", "d"],
        teachers=["A", "B"],
        blocks={"A": np.array([0, 1]), "B": np.array([3, 2])},
        signals=signals,
        device=torch.device("cpu"),
        route={"scores": scores, "weighting": "softmax", "temperatures": None, **route},
    )


def test_build_with_mc_certainty_matches_muki_loss_by_hand():
    objective = build(make_ctx(mc=True), method_args("muki", {}))  # defaults: soft, τ_s = 0.2, τ = 1, margin on
    model = LookupStudent(STUDENT)
    loss, terms = objective.loss(model, BATCH)
    # train row 2: scores (0.1, 0.7) -> a_A = softmax([0.5, 3.5])_A; A (¼,¾) on 0,1; B ¾ on class 3, ¼ on class 2
    a2 = math.exp(0.5) / (math.exp(0.5) + math.exp(3.5))
    q_row2 = [a2 / 4, 3 * a2 / 4, (1 - a2) / 4, 3 * (1 - a2) / 4]
    # train row 0: scores (0.6, 0.2) -> a_A = softmax([3, 1])_A; A (¾,¼); B (½,½)
    a0 = math.exp(3) / (math.exp(3) + math.exp(1))
    q_row0 = [3 * a0 / 4, a0 / 4, (1 - a0) / 2, (1 - a0) / 2]
    q = torch.tensor([q_row2, q_row0])
    m = torch.tensor([0.6 + 1e-6, 0.4 + 1e-6])
    z = STUDENT[[1, 0]]  # the stub's rows for input_ids (1, 0)
    expected = muki_loss(z, q, m, 1.0).item()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    hand = (
        (0.6 + 1e-6) * kl(q_row2, softmax(STUDENT[1].tolist()))
        + (0.4 + 1e-6) * kl(q_row0, softmax(STUDENT[0].tolist()))
    ) / 2
    assert loss.item() == pytest.approx(hand, rel=1e-5)
    assert terms == {"kd": pytest.approx(expected, rel=1e-5)}
    loss.backward()
    assert model.table.grad is not None and model.table.grad.abs().sum() > 0


def test_build_without_margin_is_the_plain_batch_mean():
    ctx = make_ctx(mc=True)
    with_margin, _ = build(ctx, method_args("muki", {"aggregation": "hard"})).loss(LookupStudent(STUDENT), BATCH)
    plain, _ = build(ctx, method_args("muki", {"aggregation": "hard", "margin": False})).loss(
        LookupStudent(STUDENT), BATCH
    )
    # hard: row 2 -> B (¾ on class 3, ¼ on class 2), row 0 -> A (¾, ¼)
    kl_row2 = kl([0, 0, 0.25, 0.75], softmax(STUDENT[1].tolist()))  # = KL2
    kl_row0 = kl([0.75, 0.25, 0, 0], softmax(STUDENT[0].tolist()))  # = KL1
    assert plain.item() == pytest.approx((kl_row2 + kl_row0) / 2, rel=1e-5)
    assert with_margin.item() == pytest.approx((M2 * kl_row2 + M1 * kl_row0) / 2, rel=1e-5)


def test_build_no_mc_scores_from_the_logits_only():
    ctx = make_ctx(mc=False)  # no "mc" / "certainty" signal at all
    loss, _ = build(ctx, method_args("muki_no_mc", {})).loss(LookupStudent(STUDENT), BATCH)
    # row 2: A (¼,¾) and B (¾,¼) both have u = 0.18872: equal weights ½, margin 1e-6
    q_row2 = [1 / 8, 3 / 8, 1 / 8, 3 / 8]
    # row 0: A (¾,¼) u = 0.18872, B uniform u = 0: a_A = softmax([0.18872, 0] / 0.2)_A, margin 0.18872 + 1e-6
    a0 = 1 / (1 + math.exp(-U_3_1 / 0.2))
    q_row0 = [3 * a0 / 4, a0 / 4, (1 - a0) / 2, (1 - a0) / 2]
    hand = (
        1e-6 * kl(q_row2, softmax(STUDENT[1].tolist())) + (U_3_1 + 1e-6) * kl(q_row0, softmax(STUDENT[0].tolist()))
    ) / 2
    assert loss.item() == pytest.approx(hand, rel=1e-4)


def test_an_unknown_aggregation_is_refused():
    """By the registry, where every method_args is checked when the DAG is built."""
    for method, aggregation in (("muki", "vote"), ("muki_no_mc", "vote"), ("muki", "mean")):
        with pytest.raises(KdpipeError, match=f"aggregation: '{aggregation}'; choose one of hard, soft"):
            method_args(method, {"aggregation": aggregation})


def test_router_weights_are_used_as_they_are_for_soft_aggregation():
    # a learned router's probabilities: row 2 (0.25, 0.75), row 0 (1, 0); soft q = Σ w_k p̃_k, no softmax over them
    weights = torch.tensor([[1.0, 0.0], [0.5, 0.5], [0.25, 0.75]])
    ctx = make_ctx(mc=True, scores=weights, weighting="scores")
    loss, _ = build(ctx, method_args("muki", {"router": "learned", "margin": False})).loss(
        LookupStudent(STUDENT), BATCH
    )
    q_row2 = [0.25 / 4, 0.25 * 3 / 4, 0.75 / 4, 0.75 * 3 / 4]  # A (¼,¾); B ¾ on class 3, ¼ on class 2
    q_row0 = [3 / 4, 1 / 4, 0, 0]
    hand = (kl(q_row2, softmax(STUDENT[1].tolist())) + kl(q_row0, softmax(STUDENT[0].tolist()))) / 2
    assert loss.item() == pytest.approx(hand, rel=1e-5)


def test_calibrated_route_tempers_each_teachers_soft_labels():
    # teacher A at T_A = 2: logits (2ln3, 0) / 2 -> (¾, ¼); teacher B at T_B = 1 unchanged
    padded = padded_probs(
        [torch.tensor([[2 * LN3, 0.0]]), torch.tensor([[0.0, LN3]])], BLOCKS, 4, 1.0, calibration=[2.0, 1.0]
    )
    assert padded.numpy() == pytest.approx(np.array([[[0.75, 0.25, 0, 0], [0, 0, 0.25, 0.75]]]))


def test_muki_without_a_route_is_an_error():
    ctx = make_ctx(mc=True)
    ctx.route = None
    with pytest.raises(KdpipeError, match="has no route"):
        build(ctx, method_args("muki"))
