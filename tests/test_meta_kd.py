"""Meta-KD (docs/methods.md §4): prototype scores, the expertise weight, the meta-teacher loss and both student
stages against hand-computed values; the stage-1 objective's wiring; the plan's two-stage split and its checks;
per-domain data, signals and evaluation; the disk check of large dumps."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from transformers import AutoModelForSequenceClassification, BertConfig

from kdpipe.core import store
from kdpipe.core.store import KdpipeError, write_json
from kdpipe.data.batching import encode
from kdpipe.data.dataset import read_split
from kdpipe.data.prepare import prepare
from kdpipe.evaluation.results import per_domain_accuracy
from kdpipe.methods.base import DistillContext
from kdpipe.methods.meta_kd.domain import expertise_weight
from kdpipe.methods.meta_kd.prototypes import prototype_scores, prototypes
from kdpipe.methods.meta_kd.student import attention_mse, build_stage1, example_weights, soft_cross_entropy, stage1_loss
from kdpipe.methods.meta_kd.teacher import corrupted_domains, meta_teacher_loss
from kdpipe.models.loading import load_tokenizer
from kdpipe.report import build_report
from kdpipe.signals.features import dump_feature
from kdpipe.signals.load import RowView, TokenFeature, subset_signals
from tests.conftest import REPO, TINY_DATASET, dataset_settings, method_args
from tests.test_plan import load
from tests.test_workflow_meta import domain_dataset

# ---- prototype scores ------------------------------------------------------------------------------------------

# Five rows of class 0 over three domains, one row of class 1 that only domain 0 has.
EMB = np.array([[1, 0], [0, 1], [1, 1], [1, -1], [2, 0], [0, 3]], dtype=np.float32)
DOM = np.array([0, 0, 1, 1, 2, 0])
CLS = np.array([0, 0, 0, 0, 0, 1])


def test_prototype_scores_by_hand():
    """Class 0's prototypes: domain 0 [0.5, 0.5], domain 1 ([1, 1] and [1, -1]) [1, 0], domain 2 [2, 0]."""
    protos, counts = prototypes(EMB, DOM, CLS, 3, 2, "domain_class")
    np.testing.assert_allclose(protos[:, 0], [[0.5, 0.5], [1, 0], [2, 0]])
    assert counts.tolist() == [[2, 1], [2, 0], [1, 0]]
    scores, has_other = prototype_scores(EMB, DOM, CLS, protos, counts, "domain_class")
    # row 0, [1, 0] in domain 0: own cos([1,0], [.5,.5]) = 1/√2; the others' mean [1.5, 0], cos 1
    assert scores[0] == pytest.approx(0.5 * (1 / math.sqrt(2) + 1))
    # row 2, [1, 1] in domain 1: own cos([1,1], [1,0]) = 1/√2; the others' mean [1.25, .25], cos 1.5/(√2·√1.625)
    assert scores[2] == pytest.approx(0.5 * (1 / math.sqrt(2) + 1.5 / (math.sqrt(2) * math.sqrt(1.625))))
    # row 4, [2, 0] in domain 2: own cos 1; the others' mean [.75, .25], cos .75/√.625
    assert scores[4] == pytest.approx(0.5 * (1 + 0.75 / math.sqrt(0.625)))
    # row 5: no other domain has class 1, so its score is the cosine to its own prototype alone ([0, 3]: 1)
    assert has_other.tolist() == [True] * 5 + [False] and scores[5] == pytest.approx(1.0)


def test_prototypes_by_domain_ignore_the_class():
    """EasyNLP's variant: one prototype per domain, so the class-1 row joins domain 0's prototype."""
    protos, counts = prototypes(EMB, DOM, CLS, 3, 2, "domain")
    np.testing.assert_allclose(protos[:, 0], [[1 / 3, 4 / 3], [1, 0], [2, 0]])
    scores, has_other = prototype_scores(EMB, DOM, CLS, protos, counts, "domain")
    assert has_other.all()
    # row 5, [0, 3]: own cos([0,3], [1/3, 4/3]) = 4/√17; the others' mean [1.5, 0], cos 0
    assert scores[5] == pytest.approx(0.5 * (4 / math.sqrt(17)))
    # any other grouping is refused once, by the config schema, before any job runs
    import jsonschema

    schema = yaml.safe_load((REPO / "kdpipe/config.schema.yaml").read_text())["properties"]["prototypes"]
    with pytest.raises(jsonschema.ValidationError, match=r"'class' is not one of \['domain_class', 'domain'\]"):
        jsonschema.validate({"by": "class"}, schema)


# ---- teacher signals and losses --------------------------------------------------------------------------------


def test_expertise_weight_by_hand():
    p = np.array([1.0, 0.0, 0.5])
    np.testing.assert_allclose(expertise_weight(p), [0.5, 1 / (1 + math.e), 1 / (1 + math.exp(0.25))])
    assert torch.allclose(expertise_weight(torch.tensor([1.0])), torch.tensor([0.5]))


def test_meta_teacher_loss_by_hand():
    """(1/B) Σ t_i [CE(z_i, y_i) + γ CE(ℓ_i, d_π(i))]: row 1 CE ln 2 and domain CE ln 3 (uniform), row 2 CE
    −ln .75 and domain CE −ln .5."""
    logits = torch.tensor([[0.0, 0.0], [math.log(3), 0.0]])
    domain_logits = torch.tensor([[0.0, 0.0, 0.0], [math.log(2), 0.0, 0.0]])
    total, ce, dom = meta_teacher_loss(
        logits, torch.tensor([1, 0]), domain_logits, torch.tensor([2, 0]), torch.tensor([1.0, 0.5]), gamma=0.5
    )
    expected = (1.0 * (math.log(2) + 0.5 * math.log(3)) + 0.5 * (-math.log(0.75) + 0.5 * math.log(2))) / 2
    assert total.item() == pytest.approx(expected, rel=1e-6)
    assert ce.item() == pytest.approx((math.log(2) - math.log(0.75)) / 2, rel=1e-6)
    assert dom.item() == pytest.approx((math.log(3) + math.log(2)) / 2, rel=1e-6)


def test_corrupted_domains_permute_the_batch():
    torch.manual_seed(0)
    domains = torch.tensor([0, 0, 1, 2, 2, 2])
    shuffled = corrupted_domains(domains)
    assert sorted(shuffled.tolist()) == sorted(domains.tolist()) and not torch.equal(shuffled, domains)


def test_attention_mse_counts_only_real_query_key_pairs_and_averages_heads():
    mask = torch.tensor([[1.0, 0.0]])  # the second token is padding
    student = torch.tensor([[[0.6, 0.4], [0.5, 0.5]]])  # head-averaged [B, S, S]
    teacher = torch.tensor([[[0.2, 0.0], [0.0, 0.0]]])
    assert attention_mse(student, teacher, mask).item() == pytest.approx(0.16)  # (0.6 − 0.2)² at (0, 0) only
    heads = torch.stack([student, student - torch.tensor([[[0.2, 0.0], [0.0, 0.0]]])], 1)  # [B, 2, S, S]
    assert attention_mse(heads, teacher[:, None].expand(1, 2, 2, 2), mask).item() == pytest.approx((0.16 + 0.04) / 2)


def test_stage1_loss_keeps_the_weights_per_example():
    """λ = (1 + t)·w per example: (0.75·(1 + 3 + ½·10) + 0.3·(2 + 4 + ½·20)) / 2, not mean(λ)·mean(terms)."""
    weights = example_weights(torch.tensor([0.5, 0.0]), torch.tensor([0.5, 0.3]))
    assert weights.tolist() == pytest.approx([0.75, 0.3])
    loss = stage1_loss(torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0]), torch.tensor([10.0, 20.0]), weights, 0.5)
    assert loss.item() == pytest.approx((0.75 * 9 + 0.3 * 16) / 2)
    assert loss.item() != pytest.approx(weights.mean().item() * 12.5)  # EasyNLP's collapsed form


def test_stage2_soft_cross_entropy_by_hand():
    teacher = torch.tensor([[0.0, math.log(3)]])  # softmax [.25, .75]
    student = torch.tensor([[math.log(3), 0.0]])  # softmax [.75, .25]
    expected = -(0.25 * math.log(0.75) + 0.75 * math.log(0.25))
    assert soft_cross_entropy(student, teacher, 1.0).item() == pytest.approx(expected, rel=1e-6)
    # at T = 2 both sides soften: teacher [1, √3]/(1 + √3), student [√3, 1]/(1 + √3)
    pt = np.array([1, math.sqrt(3)]) / (1 + math.sqrt(3))
    ps = pt[::-1]
    assert soft_cross_entropy(student, teacher, 2.0).item() == pytest.approx(-(pt * np.log(ps)).sum(), rel=1e-6)


# ---- the stage-1 objective's wiring ----------------------------------------------------------------------------


def _tiny_model(hidden: int = 32, heads: int = 2, layers: int = 2, seed: int = 0):
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=2,
        attn_implementation="eager",
    )
    return AutoModelForSequenceClassification.from_config(config)


def _context(model, encoded, tmp_path, student_config, t, w, domains) -> DistillContext:
    """A stage-1 context whose cached teacher features are ``model``'s own: hidden states 0..2, attentions 1..2."""
    device = torch.device("cpu")
    lengths = encoded.lengths
    signals = {"labels": ["neg", "pos"]}
    for feature, layers in (("hidden", [0, 1, 2]), ("attentions", [1, 2])):
        dump_feature(model, encoded, feature, layers, tmp_path / f"{feature}.npy", batch_size=4, device=device)
        signals[feature] = TokenFeature.packed(
            feature,
            np.load(tmp_path / f"{feature}.npy", mmap_mode="r"),
            lengths,
            layers,
            hidden_size=model.config.hidden_size,
            heads=model.config.num_attention_heads,
        )
    rng = np.random.default_rng(0)
    signals.update(
        domain=rng.normal(size=(len(encoded), model.config.hidden_size)).astype(np.float16), expertise=torch.tensor(w)
    )
    return DistillContext(
        labels=["neg", "pos"],
        teachers=["t"],
        blocks={"t": np.array([0, 1])},
        signals={"t": signals},
        device=device,
        student_config=student_config,
        train_lengths=lengths,
        alignment={"t": [[0, 0], [1, 1], [2, 2]]},
        domains=["a", "b"],
        domain_ids=torch.tensor(domains),
        prototype_scores=torch.tensor(t),
    )


def test_stage1_objective_pairs_the_layers_and_weights_each_example(tmp_path):
    """A student identical to the "teacher" whose features were dumped matches its attentions and hidden states
    exactly (a mis-paired layer, slot or mask would not): only λ_i·γ·MSE_i(g_s, g_t) remains, per example."""
    tokenizer = load_tokenizer("builtin:tiny-bert")
    texts = ["a short one", "a somewhat longer sentence here", "mid length text", "x"]
    encoded = encode(tokenizer, texts, max_length=16)
    model = _tiny_model()
    t, w, domains = [0.5, 0.9, 0.1, 0.7], [0.3, 0.5, 0.4, 0.27], [0, 1, 1, 0]
    ctx = _context(model, encoded, tmp_path, model.config, t, w, domains)
    objective = build_stage1(ctx, method_args("meta_kd_stage1", {"gamma": 0.5}))
    adapters = objective.extra_modules["meta_kd_adapters"][0]
    assert isinstance(adapters.fit_dense, torch.nn.Identity)  # same width: no projection
    assert objective.validates is False
    from kdpipe.data.batching import collate

    batch = collate(encoded, np.array([1, 3, 0]))
    loss, terms = objective.loss(model, batch)
    assert terms["attention"] == pytest.approx(0.0, abs=1e-6) and terms["hidden"] == pytest.approx(0.0, abs=1e-5)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        g_s = adapters.branch.representation(
            out.hidden_states[-1], batch["attention_mask"].float(), torch.tensor([1, 0, 0])
        )
        g_t = torch.tensor(ctx.signal("t", "domain")[[1, 3, 0]].astype(np.float32))
        per_example = ((g_s - g_t) ** 2).mean(-1)
        lam = (1 + torch.tensor([0.9, 0.7, 0.5])) * torch.tensor([0.5, 0.27, 0.3])
    assert loss.item() == pytest.approx((lam * 0.5 * per_example).mean().item(), rel=1e-4)


def test_stage1_objective_projects_a_narrower_student_and_averages_heads(tmp_path):
    tokenizer = load_tokenizer("builtin:tiny-bert")
    encoded = encode(tokenizer, ["one two three", "four five"], max_length=16)
    teacher = _tiny_model()
    student = _tiny_model(hidden=16, heads=1, layers=1, seed=1)
    ctx = _context(teacher, encoded, tmp_path, student.config, [0.1, 0.2], [0.4, 0.5], [0, 1])
    ctx.alignment = {"t": [[0, 0], [1, 2]]}
    with pytest.raises(KdpipeError, match="heads"):
        build_stage1(ctx, method_args("meta_kd_stage1", {}))  # per-head dump, 1-head student
    out = tmp_path / "attentions_mean.npy"  # what a student with another head count reads
    dump_feature(teacher, encoded, "attentions_mean", [1, 2], out, batch_size=4, device=torch.device("cpu"))
    mean = TokenFeature.packed("attentions_mean", np.load(out), encoded.lengths, [1, 2], hidden_size=32, heads=2)
    assert mean.heads is None and mean.rows(np.array([1]), 0, 5).shape == (1, 5, 5)
    ctx.signals["t"]["attentions"] = mean
    objective = build_stage1(ctx, method_args("meta_kd_stage1", {}))
    adapters = objective.extra_modules["meta_kd_adapters"][0]
    assert isinstance(adapters.fit_dense, torch.nn.Linear) and adapters.fit_dense.weight.shape == (32, 16)
    from kdpipe.data.batching import collate

    loss, terms = objective.loss(student, collate(encoded, np.array([0, 1])))
    loss.backward()
    assert terms["attention"] > 0 and adapters.fit_dense.weight.grad.abs().sum() > 0


# ---- data, signals, evaluation ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def domain_data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("domains")
    domain_dataset().to_csv(folder / "domains.csv", index=False)
    out = folder / "data"
    prepare(
        dataset_settings(
            {
                **TINY_DATASET,
                "name": "domains",
                "source": str(folder / "domains.csv"),
                "max_per_class": None,
                "domain_column": "domain",
            }
        ),
        out,
    )
    return out


def test_splits_are_stratified_by_domain_and_label(domain_data):
    """Every domain keeps each of its classes in every split (per-domain students train, validate and test)."""
    for split, per_stratum in (("train", 18), ("validation", 6), ("test", 6)):
        frame = read_split(domain_data, split)
        counts = frame.groupby(["domain", "label"]).size()
        assert len(counts) == 6 and (counts == per_stratum // 2).all(), (split, counts)
    assert store.read_json(domain_data / "manifest.json")["domains"] == ["books", "dvd", "kitchen"]


def test_row_subset_reads_the_rows_of_a_domain():
    array = np.arange(5 * 2 * 3).reshape(5, 2, 3)
    view = RowView([array], np.array([4, 1]))
    assert view.shape == (2, 2, 3) and view.ndim == 3
    np.testing.assert_array_equal(view[np.array([1, 0]), 1, :2], array[[1, 4], 1, :2])
    np.testing.assert_array_equal(view[0], array[4])
    lengths = np.array([1, 2, 3, 1, 2])  # packed hidden states of 2 layers x 1 float: row 4 is entries 7 and 8
    packed = np.arange(9 * 2, dtype=np.float16).reshape(9, 2, 1)
    hidden = TokenFeature.packed("hidden", packed, lengths, [0, 3], hidden_size=1, heads=2, token_hashes=lengths * 10)
    signals = subset_signals(
        {"logits": torch.arange(10.0).view(5, 2), "domain": array, "hidden": hidden, "labels": ["a", "b"]},
        np.array([4, 1]),
    )
    assert signals["logits"].tolist() == [[8.0, 9.0], [2.0, 3.0]] and signals["labels"] == ["a", "b"]
    np.testing.assert_array_equal(signals["domain"][1], array[1])
    view = signals["hidden"]
    assert view.lengths.tolist() == [2, 2] and view.token_hashes.tolist() == [20, 20] and view.layers == [0, 3]
    assert view.arrays[0] is packed  # nothing copied
    # layer slot 1 of rows 4 (entries 7, 8) and 1 (entries 1, 2), padded to 3 tokens
    assert view.rows(np.array([0, 1]), 1, 3)[..., 0].tolist() == [[15, 17, 0], [3, 5, 0]]


def test_per_domain_accuracy_and_report_table(tmp_path):
    probs = np.array([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    assert per_domain_accuracy(probs, np.array([0, 0, 0, 1]), np.array(["a", "a", "b", "b"])) == {
        "a": {"n": 2, "accuracy": 0.5},
        "b": {"n": 2, "accuracy": 1.0},
    }
    from tests.test_report import _eval

    paths = []
    for model, base, kind, method, seed, domain, per_domain in (
        ("meta", "meta", "teacher", None, None, None, {"a": 0.9, "b": 0.8}),
        ("s.seed0", "s", "student", "meta_kd", 0, "a", {"a": 0.7}),
        ("s.seed1", "s", "student", "meta_kd", 1, "a", {"a": 0.8}),
    ):
        record = _eval(model, base, kind, method, seed, "test", ["neg", "pos"], 0.8, 0.05, 10.0, 1000)
        record["domain"] = domain
        record["metrics"]["per_domain"] = {d: {"n": 10, "accuracy": a} for d, a in per_domain.items()}
        paths.append(tmp_path / f"{model}.json")
        write_json(paths[-1], record)
    build_report(paths, tmp_path / "report")
    text = (tmp_path / "report/summary.md").read_text()
    assert "| meta | teacher | — | all domains | 1 | 90.0 | 80.0 | 85.0 |" in text
    assert "| s | student | meta_kd | a | 2 | 75.0 ± 7.1 |  | — |" in text
    tsv = pd.read_csv(tmp_path / "report/summary.tsv", sep="\t")
    assert tsv.set_index("model").loc["s", "domain"] == "a"


# ---- the disk check ---------------------------------------------------------------------------------------------


def test_a_dump_that_would_not_fit_is_refused_before_writing(tmp_path, monkeypatch):
    tokenizer = load_tokenizer("builtin:tiny-bert")
    encoded = encode(tokenizer, ["one two three", "four five"], max_length=16)
    # rows of 5 and 4 tokens; the dump needs 2 layers x 2 heads x (5² + 4²) x 2 bytes = 328 bytes
    assert encoded.lengths.tolist() == [5, 4]
    free = store.DISK_RESERVE + 300  # 300 bytes above the reserve
    monkeypatch.setattr(store.shutil, "disk_usage", lambda path: type("Usage", (), {"free": free})())
    with pytest.raises(KdpipeError, match=r"attentions dump \(2 rows, 9 tokens\) needs 328 bytes .*heads: mean"):
        dump_feature(
            _tiny_model(),
            encoded,
            "attentions",
            [1, 2],
            tmp_path / "attentions.npy",
            batch_size=2,
            device=torch.device("cpu"),
        )
    assert not (tmp_path / "attentions.npy").exists()


# ---- the plan ---------------------------------------------------------------------------------------------------


def _meta_config(c):
    c.update(yaml.safe_load((REPO / "tests/configs/tiny_domains.yaml").read_text()))


@pytest.fixture
def domain_csv(tmp_path, monkeypatch):
    """The tiny domains config's data file, where the config says it is: the plan reads the data's labels."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    domain_dataset().to_csv(tmp_path / "data/domains.csv", index=False)


def test_plan_runs_meta_kd_as_two_jobs_and_evaluates_the_second(domain_csv):
    plan = load(edit=_meta_config)
    assert plan.first_stages == {"s_meta.stage1": "s_meta", "s_meta_narrow.stage1": "s_meta_narrow"}
    first, second = plan.student_params("s_meta.stage1"), plan.student_params("s_meta")
    assert (
        first["method"] == "meta_kd_stage1"
        and first["epochs"] == 2
        and first["method_args"] == {"gamma": 0.5, "attention_heads": "auto"}
    )
    assert first["attention_feature"] == "attentions" and first["alignment"] == {"meta": [[0, 0], [1, 2]]}
    assert second["method"] == "meta_kd" and second["epochs"] == 1 and second["method_args"] == {"temperature": 2.0}
    assert second["model"] == {"init": {"from": "results/students/s_meta.stage1"}}
    assert plan.init_dirs("s_meta") == ["results/students/s_meta.stage1"] and plan.init_dirs("s_vkd") == []
    assert plan.student_params("s_meta_narrow.stage1")["attention_feature"] == "attentions_mean"
    assert "s_meta.stage1" not in plan.models() and "s_meta" in plan.models()
    # the dumps keep only the aligned layers: hidden states 0 and 2, attention layer 2
    assert plan.feature_layers("meta", "hidden") == [0, 2] and plan.feature_layers("meta", "attentions") == [2]
    assert plan.feature_layers("plain", "hidden") == []
    assert plan.teacher_prototype_files("meta") == ["results/prototypes/train.parquet"]
    assert plan.teacher_prototype_files("plain") == [] and plan.teacher_modules("meta") == [
        "kdpipe.methods.meta_kd.teacher"
    ]
    assert plan.eval_params("s_meta")["domain"] == "books" and "domain" not in plan.eval_params("meta")
    # every teacher's slice holds its full settings; only a teacher objective other than ce brings its module
    plain, meta = plan.teacher_params("plain"), plan.teacher_params("meta")
    assert (plain["objective"], plain["objective_args"], plain["domain"]) == ("ce", {}, None)
    assert "objective_module" not in plain and "prompt" not in plain
    assert meta["objective"] == "meta" and meta["objective_module"] == "kdpipe.methods.meta_kd.teacher"


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: c["students"]["s_meta"].update(teachers=["plain"]),
            r"students\.s_meta: method 'meta_kd' distils teachers trained with objective: meta; teacher 'plain'",
        ),
        (lambda c: c["students"]["s_vkd"].update(method="meta_kd_stage1"), r"first stage of another method"),
        (
            lambda c: c["students"]["s_meta_narrow"].update(method_args={"stage1": {"attention_heads": "per_head"}}),
            r"per_head, but the student has 1 heads and its teachers \[2\]",
        ),
        (
            lambda c: c["students"]["s_meta_narrow"].update(method_args={"stage1": {"attention_heads": "heads"}}),
            r"students\.s_meta_narrow\.method_args\.stage1\.attention_heads: 'heads'; choose auto, per_head or mean",
        ),
    ],
)
def test_meta_kd_config_errors_name_the_key(edit, message):
    def both(c):
        _meta_config(c)
        edit(c)

    with pytest.raises(KdpipeError, match=message):
        load(edit=both)


def test_per_domain_entries_expand_into_one_student_per_domain_of_the_data(tmp_path, monkeypatch):
    """``per_domain: true`` reads the domains from the data file when the plan is built: one config fits any data."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    frame = domain_dataset()
    frame.loc[frame["domain"] == "kitchen", "domain"] = "home & kitchen"  # not a valid job name as it is
    frame.to_csv(tmp_path / "data/domains.csv", index=False)

    def edit(c):
        _meta_config(c)
        c["students"] = {"mk": {"method": "meta_kd", "teachers": ["meta"], "per_domain": True, "seeds": [0, 1]}}

    plan = load(edit=edit)
    names = [s for s in plan.students if not s.endswith(".stage1")]
    assert names == [f"mk.{d}.seed{s}" for d in ("books", "dvd", "home___kitchen") for s in (0, 1)]
    assert plan.student_params("mk.home___kitchen.seed1")["domain"] == "home & kitchen"
    assert plan.student_params("mk.dvd.seed0.stage1")["domain"] == "dvd"
    evaluation = plan.eval_params("mk.dvd.seed0")
    assert evaluation["base"] == "mk.dvd" and evaluation["group"] == "mk" and evaluation["domain"] == "dvd"

    def both(c):
        edit(c)
        c["students"]["mk"]["domain"] = "dvd"

    with pytest.raises(KdpipeError, match="set domain or per_domain, not both"):
        load(edit=both)


def test_report_puts_a_per_domain_entry_on_one_row(tmp_path):
    from tests.test_report import _eval

    paths = []
    for model, domain, accuracy in (("mk.a", "a", 0.7), ("mk.b", "b", 0.6)):
        record = _eval(model, model, "student", "meta_kd", 0, "test", ["neg", "pos"], accuracy, 0.05, 10.0, 1000)
        record.update(domain=domain, group="mk")
        record["metrics"]["per_domain"] = {domain: {"n": 10, "accuracy": accuracy}}
        paths.append(tmp_path / f"{model}.json")
        write_json(paths[-1], record)
    build_report(paths, tmp_path / "report")
    assert (
        "| mk | student | meta_kd | each domain | 1 | 70.0 | 60.0 | 65.0 |"
        in (tmp_path / "report/summary.md").read_text()
    )


def test_a_domain_the_data_lacks_is_named_in_the_error(domain_data):
    from kdpipe.data.dataset import restrict_to_domain

    frame = read_split(domain_data, "train")
    assert set(restrict_to_domain(frame, "dvd", ["books", "dvd", "kitchen"], "x")["domain"]) == {"dvd"}
    with pytest.raises(KdpipeError, match=r"students.s.domain: unknown domain 'music'; the data's domains are"):
        restrict_to_domain(frame, "music", ["books", "dvd", "kitchen"], "students.s.domain")
    with pytest.raises(KdpipeError, match=r"domain 'dvd' needs a domain per row.*set dataset.domain_column"):
        restrict_to_domain(frame, "dvd", None, "students.s.domain")


def test_a_per_domain_meta_kd_students_label_count_includes_the_prototypes_labels(domain_data, tmp_path):
    """A per-domain student's first stage trains on its domain's rows, but the prototype scores that weigh them are
    means over every domain's train rows by gold class: its record counts those, and the second stage, started from
    the first, inherits the record (docs/report.md, "Which gold labels each model read")."""
    from types import SimpleNamespace

    from kdpipe.methods.meta_kd.prototypes import write_prototype_scores
    from kdpipe.methods.meta_kd.settings import PrototypeSettings
    from kdpipe.methods.registry import get_method
    from kdpipe.methods.started_labels import started_label_use

    scores = tmp_path / "prototypes" / "train.parquet"
    settings = {"backbone": "builtin:tiny-bert", "by": "domain_class", "max_length": 16, "batch_size": 16}
    write_prototype_scores(PrototypeSettings.from_params(settings), domain_data, scores)
    train = read_split(domain_data, "train")
    books = int((train["domain"] == "books").sum())
    assert 0 < books < len(train)
    stage1 = SimpleNamespace(**get_method("meta_kd_stage1").job_spec())
    first = started_label_use(None, stage1, books, None, scores)
    assert first == {"train": len(train)}
    folder = tmp_path / "stage1"
    folder.mkdir()
    write_json(folder / "manifest.json", {"gold_labels": first})
    stage2 = SimpleNamespace(**get_method("meta_kd").job_spec())
    assert started_label_use(str(folder), stage2, books, None, None) == {"train": len(train)}
