"""The multi-head (Hydra) student of docs/methods.md §3 on a tiny random BERT: equivalence, outputs, saving,
gradients."""

import copy
import json

import pytest
import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from kdpipe.core.store import KdpipeError
from kdpipe.models.loading import load_classifier, load_trained
from kdpipe.models.multihead import MultiHeadClassifier, load_multihead, make_multihead
from kdpipe.models.students import build_student

LABELS = ["a", "b", "c"]
IDS = torch.tensor(
    [[101, 2023, 2003, 1037, 102, 0, 0], [101, 7592, 102, 0, 0, 0, 0], [101, 2307, 2154, 2000, 2175, 2188, 102]]
)
MASK = (torch.arange(7)[None] < torch.tensor([[5], [3], [7]])).long()
TYPES = torch.tensor([[0, 0, 0, 1, 1, 0, 0], [0] * 7, [0, 0, 0, 0, 1, 1, 1]])


def tiny(attn=None, seed=0):
    return load_classifier("builtin:tiny-bert", LABELS, seed=seed, attn=attn)


def run(model, ids=IDS, mask=MASK, types=TYPES):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, token_type_ids=types)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_one_head_reproduces_the_base_model_with_padding(attn):
    base = tiny(attn).eval()
    assert base.config._attn_implementation == attn
    model = make_multihead(copy.deepcopy(base), heads=1, head_layers=1, seed=0).eval()
    expected = run(base).logits
    out = run(model)
    assert out.head_logits.shape == (1, 3, 3)
    assert torch.allclose(out.logits.softmax(-1), expected.softmax(-1), atol=1e-5)
    assert torch.allclose(out.head_logits[0], expected, atol=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_padding_does_not_change_a_row(attn):
    model = make_multihead(tiny(attn), heads=3, head_layers=1, seed=0).eval()
    padded = run(model).head_logits[:, 1]
    alone = run(model, IDS[1:2, :3], MASK[1:2, :3], TYPES[1:2, :3]).head_logits[:, 0]
    assert torch.allclose(padded, alone, atol=1e-5)


def test_three_heads_mean_their_probabilities():
    model = make_multihead(tiny(), heads=3, head_layers=1, seed=0).eval()
    out = run(model)
    assert out.head_logits.shape == (3, 3, 3) and out.logits.shape == (3, 3)
    assert torch.allclose(out.logits, out.head_logits.softmax(-1).mean(0).log(), atol=1e-6)
    # the heads start from the same copied top layer but different classifiers, so their outputs differ
    assert not torch.allclose(out.head_logits[0], out.head_logits[1])
    assert model.config.multihead_heads == 3 and model.config.multihead_head_layers == 1
    assert model.config.num_labels == 3 and model.config.hidden_size == 32


def test_structure_and_head_linears():
    model = make_multihead(tiny(), heads=2, head_layers=1, seed=0)
    assert len(model.core) == 1 and all(len(head.layers) == 1 for head in model.heads)
    linears = model.head_linears()
    # per head: query, key, value, attention output, intermediate, output, pooler, classifier
    assert [len(x) for x in linears] == [8, 8]
    assert [tuple(m.weight.shape) for m in linears[0]] == [tuple(m.weight.shape) for m in linears[1]]
    assert linears[0][-1] is model.heads[0].classifier and linears[0][-2] is model.heads[0].pooler.dense
    assert not set(map(id, linears[0])) & set(map(id, linears[1]))
    # the copied layers share the one config (its attention implementation) with the core
    assert model.heads[1].layers[0].attention.self.config is model.config is model.core[0].attention.self.config
    # copies of the top layer start equal, classifiers do not
    assert torch.equal(linears[0][0].weight, linears[1][0].weight)
    assert not torch.equal(linears[0][-1].weight, linears[1][-1].weight)


def test_head_classifiers_are_seeded():
    a = make_multihead(tiny(), heads=2, head_layers=1, seed=3)
    b = make_multihead(tiny(), heads=2, head_layers=1, seed=3)
    c = make_multihead(tiny(), heads=2, head_layers=1, seed=4)
    assert torch.equal(a.heads[1].classifier.weight, b.heads[1].classifier.weight)
    assert not torch.equal(a.heads[1].classifier.weight, c.heads[1].classifier.weight)
    assert a.heads[1].classifier.weight.std().item() == pytest.approx(0.02, rel=0.5)
    assert a.heads[1].classifier.bias.abs().sum() == 0


def test_save_load_roundtrip(tmp_path):
    model = make_multihead(tiny(), heads=3, head_layers=1, seed=0).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "multihead.json", "model.safetensors"}
    spec = json.loads((tmp_path / "multihead.json").read_text())
    assert spec["heads"] == 3 and spec["head_layers"] == 1
    assert spec["config"]["num_hidden_layers"] == 2 and spec["config"]["multihead_heads"] == 3
    # transformers refuses the folder, naming kdpipe's loader, rather than loading a classifier with random heads
    with pytest.raises(ValueError, match=r"kdpipe-multihead \(load it with kdpipe\.models\.loading\.load_trained"):
        AutoModelForSequenceClassification.from_pretrained(tmp_path)
    expected = run(model)
    loaded = load_multihead(tmp_path)
    assert isinstance(loaded, MultiHeadClassifier) and not loaded.training
    assert torch.equal(run(loaded).head_logits, expected.head_logits)
    for loaded in (load_trained(tmp_path), load_trained(tmp_path, attn="eager")):
        assert isinstance(loaded, MultiHeadClassifier) and not loaded.training
        out = run(loaded)
        assert torch.allclose(out.head_logits, expected.head_logits, atol=1e-6)
        assert torch.allclose(out.logits, expected.logits, atol=1e-6)


def test_gradients_reach_the_core_and_every_head():
    model = make_multihead(tiny(), heads=3, head_layers=1, seed=0)
    out = model(input_ids=IDS, attention_mask=MASK, token_type_ids=TYPES)
    y = torch.tensor([0, 1, 2])
    sum(nn.functional.cross_entropy(z, y) for z in out.head_logits).backward()

    def reached(module):
        return any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.parameters())

    assert reached(model.embeddings) and reached(model.core[0])
    for head in model.heads:
        assert reached(head.layers[0]) and reached(head.pooler) and reached(head.classifier)


@pytest.mark.parametrize(("heads", "layers", "message"), [(2, 0, "1..1"), (2, 2, "1..1"), (0, 1, "at least 1")])
def test_bad_head_settings_are_refused(heads, layers, message):
    with pytest.raises(KdpipeError, match=message):
        make_multihead(tiny(), heads=heads, head_layers=layers, seed=0)


def test_non_bert_model_is_refused():
    with pytest.raises(KdpipeError, match="BERT-like"):
        make_multihead(nn.Linear(2, 2), heads=2, head_layers=1, seed=0)


def test_build_student_with_heads():
    spec = {"init": {"from": "builtin:tiny-bert"}, "heads": {"count": 2}}
    model, tokenizer = build_student(spec, LABELS, seed=0)
    assert isinstance(model, MultiHeadClassifier)
    assert len(model.heads) == 2 and len(model.heads[0].layers) == 1 and len(model.core) == 1
    single, _ = build_student({"init": {"from": "builtin:tiny-bert"}}, LABELS, seed=0)
    assert not isinstance(single, MultiHeadClassifier)
    # head 0 keeps the classifier the one-head student would have
    assert torch.equal(model.heads[0].classifier.weight, single.classifier.weight)
    with pytest.raises(KdpipeError, match="model.heads.layers"):
        build_student({"init": {"from": "builtin:tiny-bert"}, "heads": {"count": 2, "layers": 2}}, LABELS, seed=0)
