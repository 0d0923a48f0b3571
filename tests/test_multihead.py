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
from tests.conftest import REPO, model_spec

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
    model, tokenizer = build_student(model_spec(spec), LABELS, seed=0)
    assert isinstance(model, MultiHeadClassifier)
    assert len(model.heads) == 2 and len(model.heads[0].layers) == 1 and len(model.core) == 1
    single, _ = build_student(model_spec({"init": {"from": "builtin:tiny-bert"}}), LABELS, seed=0)
    assert not isinstance(single, MultiHeadClassifier)
    # head 0 keeps the classifier the one-head student would have
    assert torch.equal(model.heads[0].classifier.weight, single.classifier.weight)
    with pytest.raises(KdpipeError, match="model.heads.layers"):
        build_student(
            model_spec({"init": {"from": "builtin:tiny-bert"}, "heads": {"count": 2, "layers": 2}}), LABELS, seed=0
        )


# ---- how the heads start: head_init copy | noise | reinit (docs/methods.md §3)


def linears(head):
    return [m for m in head.modules() if isinstance(m, nn.Linear)]


def top_linears(head):
    """The Linear modules of a head's transformer layers and pooler (not its classifier)."""
    return linears(head.layers) + linears(head.pooler)


def test_copy_is_the_default_and_copies_the_top_layers():
    default = make_multihead(tiny(), heads=3, head_layers=1, seed=5)
    copied = make_multihead(tiny(), heads=3, head_layers=1, seed=5, head_init="copy", head_noise=0.5)
    assert default.state_dict().keys() == copied.state_dict().keys()
    assert all(torch.equal(v, copied.state_dict()[k]) for k, v in default.state_dict().items())
    for head in copied.heads[1:]:
        for a, b in zip(top_linears(copied.heads[0]), top_linears(head)):
            assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias)


def test_noise_perturbs_heads_after_the_first_by_the_relative_scale():
    copied = make_multihead(tiny(), heads=3, head_layers=1, seed=5)
    noisy = make_multihead(tiny(), heads=3, head_layers=1, seed=5, head_init="noise", head_noise=0.05)
    # head 0 is the base model's own top, untouched; so are the core and every bias
    for a, b in zip(linears(copied.heads[0]), linears(noisy.heads[0])):
        assert torch.equal(a.weight, b.weight)
    assert torch.equal(copied.core[0].output.dense.weight, noisy.core[0].output.dense.weight)
    for m in (1, 2):
        for a, b in zip(linears(copied.heads[m]), linears(noisy.heads[m])):  # classifier included
            relative = ((b.weight - a.weight).std() / a.weight.std()).item()
            assert relative == pytest.approx(0.05, rel=0.2)
            assert torch.equal(a.bias, b.bias)
    # each head draws its own noise
    assert not torch.allclose(
        noisy.heads[1].layers[0].output.dense.weight, noisy.heads[2].layers[0].output.dense.weight
    )


def test_noise_is_reproducible_for_a_seed():
    a, b, c = (
        make_multihead(tiny(), heads=2, head_layers=1, seed=seed, head_init="noise", head_noise=0.01)
        for seed in (3, 3, 4)
    )
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    assert not torch.equal(a.heads[1].layers[0].output.dense.weight, c.heads[1].layers[0].output.dense.weight)


def test_reinit_draws_fresh_top_layers_for_heads_after_the_first():
    base = tiny()
    top = copy.deepcopy(base.bert.encoder.layer[1])
    model = make_multihead(base, heads=3, head_layers=1, seed=5, head_init="reinit")
    again = make_multihead(tiny(), heads=3, head_layers=1, seed=5, head_init="reinit")
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in model.state_dict().items())
    base_linears = linears(top)
    for a, b in zip(base_linears, linears(model.heads[0].layers)):
        assert torch.equal(a.weight, b.weight)  # head 0 keeps the base's top layer
    for m in (1, 2):
        for a, b in zip(base_linears, linears(model.heads[m].layers)):
            assert not torch.allclose(a.weight, b.weight)
            assert b.weight.std().item() == pytest.approx(model.config.initializer_range, rel=0.3)
            assert b.bias.abs().sum() == 0
        norms = [x for x in model.heads[m].modules() if isinstance(x, nn.LayerNorm)]
        assert norms and all(torch.equal(x.weight, torch.ones_like(x.weight)) for x in norms)
    assert not torch.allclose(model.heads[1].pooler.dense.weight, model.heads[2].pooler.dense.weight)
    # the classifier of head m ≥ 1 is the seeded fresh one of `copy`
    copied = make_multihead(tiny(), heads=3, head_layers=1, seed=5)
    assert torch.equal(model.heads[1].classifier.weight, copied.heads[1].classifier.weight)


@pytest.mark.parametrize("head_init", ["noise", "reinit"])
def test_the_diversity_loss_pushes_the_top_layers_apart_from_the_start(head_init):
    """With copied top layers every head equals the mean head, where L4's gradient vanishes; noise and reinit start
    the heads apart, so L4 moves every Linear of every head at the first step."""
    from kdpipe.methods.hydra import diversity_loss

    def top_grads(init):
        model = make_multihead(tiny(), heads=3, head_layers=1, seed=0, head_init=init)
        diversity_loss(model.head_linears()).backward()
        return [linear.weight.grad.norm().item() for head in model.heads for linear in top_linears(head)]

    copied, started = top_grads("copy"), top_grads(head_init)
    assert max(copied) < 1e-4  # zero but for rounding
    assert min(started) > 1e-2 and min(started) > 1e3 * max(copied)


def test_bad_head_init_is_refused():
    """By the schema, when the plan validates each student entry (make_multihead trusts its settings)."""
    import yaml

    from kdpipe.plan.entries import validate_entry

    schema = yaml.safe_load((REPO / "kdpipe/config.schema.yaml").read_text())["properties"]["student_defaults"]
    heads = {"init": {"from": "builtin:tiny-bert"}, "heads": {"count": 2}}
    with pytest.raises(KdpipeError, match=r"students\.s\.model\.head_init: 'jitter' is not one of \['copy', 'noise'"):
        validate_entry({"model": {**heads, "head_init": "jitter"}}, schema, "students.s")
    with pytest.raises(KdpipeError, match=r"students\.s\.model\.head_noise: -1\.0 is less than the minimum of 0"):
        validate_entry({"model": {**heads, "head_init": "noise", "head_noise": -1.0}}, schema, "students.s")


def test_build_student_passes_the_head_init():
    spec = {"init": {"from": "builtin:tiny-bert"}, "heads": {"count": 2}}
    plain, _ = build_student(model_spec(spec), LABELS, seed=0)
    noisy, _ = build_student(model_spec({**spec, "head_init": "noise", "head_noise": 0.05}), LABELS, seed=0)
    expected = make_multihead(tiny(), heads=2, head_layers=1, seed=0, head_init="noise", head_noise=0.05)
    assert all(torch.equal(v, expected.state_dict()[k]) for k, v in noisy.state_dict().items())
    assert not torch.equal(plain.heads[1].layers[0].output.dense.weight, noisy.heads[1].layers[0].output.dense.weight)
    # the schema's defaults, as Snakemake fills them into student_defaults.model, change nothing
    same, _ = build_student(model_spec({**spec, "head_init": "copy", "head_noise": 0.01}), LABELS, seed=0)
    assert all(torch.equal(v, plain.state_dict()[k]) for k, v in same.state_dict().items())
    # a head_init without heads: refused by the plan (test_model_slice_keeps_head_init_only_where_it_changes_the_start)


def test_model_slice_keeps_head_init_only_where_it_changes_the_start():
    from kdpipe.plan.slices import model_slice

    base = {"init": {"from": "builtin:tiny-bert"}}
    heads = {**base, "heads": {"count": 2, "layers": 1}}
    # the defaults (or head_noise alone, which only noise reads) leave the spec as before the keys existed
    assert model_slice({**base, "head_init": "copy", "head_noise": 0.01}) == base
    assert model_slice({**heads, "head_init": "copy", "head_noise": 0.3}) == heads
    assert model_slice({**heads, "head_noise": 0.3}) == heads
    assert model_slice({**heads, "head_init": "reinit", "head_noise": 0.3}) == {**heads, "head_init": "reinit"}
    assert model_slice({**heads, "head_init": "noise"}) == {**heads, "head_init": "noise", "head_noise": 0.01}
    assert model_slice({**heads, "head_init": "noise", "head_noise": 0.1})["head_noise"] == 0.1
    with pytest.raises(KdpipeError, match=r"students\.s\.model\.head_init: 'noise' starts the heads"):
        model_slice({**base, "head_init": "noise"}, "students.s.model")


def test_head_init_defaults_agree_with_the_schema_and_make_multihead():
    import inspect

    import yaml

    from kdpipe.models.backbones import HEAD_INIT_DEFAULTS
    from tests.conftest import REPO

    schema = yaml.safe_load((REPO / "kdpipe/config.schema.yaml").read_text())
    keys = schema["properties"]["student_defaults"]["properties"]["model"]["properties"]
    assert {k: keys[k]["default"] for k in HEAD_INIT_DEFAULTS} == HEAD_INIT_DEFAULTS
    parameters = inspect.signature(make_multihead).parameters
    assert {k: parameters[k].default for k in HEAD_INIT_DEFAULTS} == HEAD_INIT_DEFAULTS
