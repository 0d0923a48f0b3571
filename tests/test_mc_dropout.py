"""MC-dropout: samples differ (dropout really on), a fixed seed reproduces them, everything else in eval mode."""

import math

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from kdpipe.data.batching import collate, encode
from kdpipe.models.inference import predict_logits, softmax
from kdpipe.models.loading import TINY_BERT, load_tokenizer
from kdpipe.signals.mc_dropout import enable_dropout, mc_dropout, mc_dropout_samples, summarise

CPU = torch.device("cpu")
TEXTS = [
    "markets fell sharply today",
    "the team won the final",
    "new phone released",
    "election results are in",
    "film festival opens",
    "shares rose after the report",
]


def tiny(hidden_dropout=0.1, attention_dropout=0.1, seed=0):
    torch.manual_seed(seed)
    config = BertConfig(
        **{**TINY_BERT, "hidden_dropout_prob": hidden_dropout, "attention_probs_dropout_prob": attention_dropout},
        num_labels=3,
    )
    return AutoModelForSequenceClassification.from_config(config)


@pytest.fixture(scope="module")
def encoded():
    return encode(load_tokenizer("builtin:tiny-bert"), TEXTS, max_length=16, row_ids=np.arange(100, 106))


def run(model, encoded, seed=0, samples=4, **kw):
    kw = {"batch_size": 4, "max_batch_rows": 64, **kw}
    return mc_dropout(model, encoded, samples=samples, seed=seed, device=CPU, **kw)


def test_samples_differ_and_a_fixed_seed_reproduces_them(encoded):
    model = tiny()
    batch = collate(encoded, np.arange(4))
    batch["row_ids"] = torch.as_tensor(encoded.row_ids[:4])
    enable_dropout(model)
    a = mc_dropout_samples(model, batch, samples=4, seed=7, max_batch_rows=64, device=CPU)
    b = mc_dropout_samples(model, batch, samples=4, seed=7, max_batch_rows=64, device=CPU)
    c = mc_dropout_samples(model, batch, samples=4, seed=8, max_batch_rows=64, device=CPU)
    assert a.shape == (4, 4, 3)
    assert not torch.allclose(a[0], a[1]), "the T passes are identical: dropout is not on"
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_whole_split_is_reproducible_and_variance_positive(encoded):
    model = tiny()
    mean1, scores1 = run(model, encoded, seed=3)
    mean2, scores2 = run(model, encoded, seed=3)
    np.testing.assert_array_equal(mean1, mean2)
    assert (scores1["variance"] > 0).all()
    assert scores1["row_id"].tolist() == list(range(100, 106))
    np.testing.assert_allclose(mean1.sum(1), 1.0, atol=1e-5)


def test_attention_dropout_is_on_too(encoded):
    """transformers gates attention-prob dropout on the attention module's own training flag."""
    _, scores = run(tiny(hidden_dropout=0.0, attention_dropout=0.5), encoded)
    assert (scores["variance"] > 0).all()


def test_without_dropout_mc_equals_the_eval_pass(encoded):
    """With p = 0 every pass is the eval-mode pass: everything but dropout is in eval mode."""
    model = tiny(hidden_dropout=0.0, attention_dropout=0.0)
    mean, scores = run(model, encoded)
    eval_probs = softmax(predict_logits(model, encoded, batch_size=4, device=CPU))
    np.testing.assert_allclose(mean, eval_probs, atol=1e-5)
    np.testing.assert_allclose(scores["variance"], 0.0, atol=1e-10)


def test_enlarged_batch_is_cut_into_chunks_when_rows_are_limited(encoded):
    mean, _ = run(tiny(), encoded, samples=5, max_batch_rows=4)  # one sample per forward pass
    assert mean.shape == (6, 3)
    np.testing.assert_allclose(mean.sum(1), 1.0, atol=1e-5)


def test_summary_scores_by_hand():
    # two samples of one row over C = 2: (0.9, 0.1) and (0.5, 0.5) -> mean (0.7, 0.3)
    samples = torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]])
    s = summarise(samples)
    h = -(0.7 * math.log(0.7) + 0.3 * math.log(0.3)) / math.log(2)
    assert s["entropy"].item() == pytest.approx(h, rel=1e-5)
    assert s["certainty"].item() == pytest.approx(1 - h, rel=1e-5)  # MUKI's u = 1 - H / log C
    assert s["max_prob"].item() == pytest.approx(0.7)
    assert s["variance"].item() == pytest.approx(0.04)  # per class var 0.04, mean 0.04


def test_mean_entropy_and_mutual_information_by_hand():
    # samples (0.9, 0.1) and (0.5, 0.5): H(p̄) = H(0.7, 0.3); mean H = (H(0.9, 0.1) + H(0.5, 0.5)) / 2; in bits (C = 2)
    s = summarise(torch.tensor([[[0.9, 0.1]], [[0.5, 0.5]]]))

    def bits(*p):
        return -sum(x * math.log2(x) for x in p)

    mean_h = (bits(0.9, 0.1) + bits(0.5, 0.5)) / 2
    assert s["mean_entropy"].item() == pytest.approx(mean_h, rel=1e-5)
    assert s["mutual_info"].item() == pytest.approx(bits(0.7, 0.3) - mean_h, rel=1e-4)
    # identical samples carry no epistemic uncertainty
    same = summarise(torch.tensor([[[0.8, 0.2]], [[0.8, 0.2]]]))
    assert same["mutual_info"].item() == pytest.approx(0.0, abs=1e-7)
