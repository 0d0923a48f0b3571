"""DFA (docs/methods.md §1): alignment, reconstruction and amalgamation shapes and values, gradients to every
adapter."""

import torch

from kdpipe.methods.dfa import Amalgamator, amalgamation_losses, masked_mse
from kdpipe.models.backbones import strided_alignment


def test_strided_alignment_from_the_last_layer_backwards():
    assert strided_alignment(6, 2) == [(2, 6), (1, 3)]
    assert strided_alignment(12, 6, 2) == [(6, 12), (5, 10)]
    assert strided_alignment(2, 1) == [(1, 2)]


def test_masked_mse_ignores_padding_by_hand():
    a = torch.tensor([[[1.0, 1.0], [5.0, 5.0]]])  # second token is padding
    b = torch.zeros(1, 2, 2)
    mask = torch.tensor([[1.0, 0.0]])
    assert masked_mse(a, b, mask).item() == 1.0  # only the first token: (1 + 1) / 2


def test_amalgamation_shapes_values_and_gradients_reach_every_adapter():
    torch.manual_seed(0)
    widths, hs = [3, 5], 4  # two teachers of different widths, a narrower student
    amal = Amalgamator(widths, hs, pairs=2)
    student = torch.randn(2, 3, hs, requires_grad=True)
    feats = [torch.randn(2, 3, w) for w in widths]
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    rec, am = amalgamation_losses(amal, 1, student, feats, mask)

    # the same by hand with the layer-1 adapters
    r = amal.encoders[1](torch.cat(feats, -1))
    assert r.shape == (2, 3, hs)
    d = amal.decoders[1](r)
    assert d.shape == (2, 3, 8)
    expected_rec = masked_mse(d[..., :3], feats[0], mask) + masked_mse(d[..., 3:], feats[1], mask)
    expected_amal = masked_mse(amal.adapters[1](student), r.detach(), mask)
    assert torch.allclose(rec, expected_rec) and torch.allclose(am, expected_amal)

    (rec + am).backward()
    for name, p in amal.named_parameters():
        if ".1." in name:  # the pair that was used
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    assert student.grad is not None and student.grad.abs().sum() > 0


def test_amalgamation_loss_does_not_train_the_encoder_through_the_student_side():
    torch.manual_seed(1)
    amal = Amalgamator([2], 2, pairs=1)
    student = torch.randn(1, 2, 2)
    _, am = amalgamation_losses(amal, 0, student, [torch.randn(1, 2, 2)], torch.ones(1, 2))
    am.backward()
    assert amal.encoders[0].weight.grad is None  # r is detached in L_amal (teacher side)
    assert amal.adapters[0].weight.grad is not None
