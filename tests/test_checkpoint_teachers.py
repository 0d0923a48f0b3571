"""Teachers from fine-tuned checkpoints: the import step, heads matched by name, kept or replaced, and the checks
made before any job runs (kdpipe/models/heads.py, kdpipe/stages/import_teacher.py, kdpipe/plan/classes.py)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, BertConfig

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import read_split
from kdpipe.models.heads import match_labels
from kdpipe.models.loading import TINY_BERT, label_maps, load_classifier, load_tokenizer, load_trained
from kdpipe.signals.io import read_features
from kdpipe.stages import finetune_teacher, import_teacher
from kdpipe.training.settings import ImportedTeacherSettings
from tests.conftest import TINY_TEACHER, run_signal, teacher_settings
from tests.test_meta_kd import _meta_config, domain_csv  # noqa: F401 (a fixture, used by name)
from tests.test_plan import load
from tests.tiny_models import tiny_distilbert

HEAD = ["Sport", "politics", "tech"]  # not the dataset's order, one name in another case


def make_checkpoint(folder, names=HEAD, seed=3):
    """A tiny random BERT sequence classifier over ``names`` saved like any Hugging Face checkpoint."""
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(BertConfig(**TINY_BERT, **label_maps(names)))
    model.save_pretrained(folder)
    load_tokenizer("builtin:tiny-bert").save_pretrained(folder)
    return model.eval()


def head_weight(model):
    return model.classifier.weight.detach().clone()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ckpt") / "clf"
    return folder, make_checkpoint(folder)


def test_labels_match_by_name_case_and_label_map():
    data = ["business", "politics", "sport", "tech"]
    assert match_labels(HEAD, data, None, "t") == ["sport", "politics", "tech"]
    assert match_labels(["LABEL_0", "LABEL_1"], data, {"LABEL_0": "tech", "LABEL_1": "sport"}, "t") == ["tech", "sport"]
    with pytest.raises(KdpipeError, match=r"class 'LABEL_1' matches no dataset label.*saved without class names"):
        match_labels(["LABEL_0", "LABEL_1"], data, {"LABEL_0": "tech"}, "teachers.x")
    with pytest.raises(KdpipeError, match=r"class 'sports' matches no dataset label \(did you mean 'sport'\?\)"):
        match_labels(["sports"], data, None, "t")
    with pytest.raises(KdpipeError, match=r"'nope' is not a class of the checkpoint"):
        match_labels(HEAD, data, {"nope": "tech"}, "t")
    with pytest.raises(KdpipeError, match=r"\['Sport', 'politics'\] all map to the dataset label 'sport'"):
        match_labels(HEAD, data, {"politics": "sport"}, "t")


def test_import_keeps_the_head_in_its_order_under_the_data_names(checkpoint, tiny_data, tmp_path):
    folder, original = checkpoint
    params = {"checkpoint": str(folder), "finetune": False, "classes": None, "max_length": 32, "eval_batch_size": 32}
    manifest = import_teacher.run(ImportedTeacherSettings.from_params(params), tiny_data, tmp_path / "t")
    assert manifest["labels"] == ["sport", "politics", "tech"]
    assert json.loads((tmp_path / "t/labels.json").read_text()) == ["sport", "politics", "tech"]
    imported = load_trained(tmp_path / "t").eval()
    assert imported.config.id2label == {0: "sport", 1: "politics", 2: "tech"}
    # the same function: no output renamed or reordered
    batch = load_tokenizer(str(folder))(["a match was won", "the minister said"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.equal(imported(**batch).logits, original(**batch).logits)
    metrics = json.loads((tmp_path / "t/metrics.json").read_text())
    valid = read_split(tiny_data, "validation")
    assert 0 <= metrics["validation"]["accuracy"] <= 1 and metrics["best_epoch"] == 0
    assert manifest["rows"]["validation"] == int(valid["label"].isin(HEAD + ["sport"]).sum())


def test_finetune_keeps_a_matching_head_and_replaces_another(checkpoint, tiny_data, tmp_path):
    folder, original = checkpoint
    base = {**TINY_TEACHER, "lr": 1e-12, "checkpoint": str(folder)}  # a step that changes nothing measurable
    finetune_teacher.run(teacher_settings(base), tiny_data, tmp_path / "kept")
    kept = load_trained(tmp_path / "kept")
    assert json.loads((tmp_path / "kept/labels.json").read_text()) == ["sport", "politics", "tech"]
    assert torch.allclose(head_weight(kept), head_weight(original), atol=1e-6)

    finetune_teacher.run(teacher_settings({**base, "classes": ["sport", "tech"]}), tiny_data, tmp_path / "new")
    new = load_trained(tmp_path / "new")
    assert json.loads((tmp_path / "new/labels.json").read_text()) == ["sport", "tech"]
    assert head_weight(new).shape == (2, 32)


def test_a_classifier_as_backbone_gets_a_fresh_head(checkpoint):
    folder, original = checkpoint
    # same number of classes: reusing the head would rename its classes by position
    model = load_classifier(str(folder), ["business", "entertainment", "politics"], seed=0)
    assert not torch.allclose(head_weight(model), head_weight(original))
    assert torch.equal(model.bert.embeddings.word_embeddings.weight, original.bert.embeddings.word_embeddings.weight)


def with_checkpoint(folder, **teacher):
    def edit(config):
        config["teachers"]["tb"] = {"checkpoint": str(folder), "finetune": False, **teacher}

    return edit


def test_plan_imports_a_checkpoint_teacher_without_training_settings(checkpoint):
    folder, _ = checkpoint
    plan = load(edit=with_checkpoint(folder))
    assert plan.imported_teachers() == ["tb"]
    assert plan.teacher_classes("tb") == ["sport", "politics", "tech"]
    params = plan.teacher_params("tb")
    assert params["checkpoint"] == str(folder) and "epochs" not in params and "backbone" not in params


@pytest.mark.parametrize(
    "teacher, message",
    [
        ({"label_map": {"Sport": "sports"}}, r"teachers\.tb: the checkpoint's class 'Sport' matches no dataset"),
        ({"classes": ["sport"]}, r"teachers\.tb\.classes: \['sport'\], but the checkpoint predicts"),
        ({"layers": [0]}, r"teachers\.tb: layers needs training, but finetune is false"),
    ],
)
def test_checkpoint_errors_stop_the_plan(checkpoint, teacher, message):
    with pytest.raises(KdpipeError, match=message):
        load(edit=with_checkpoint(checkpoint[0], **teacher))


def test_a_class_no_checkpoint_covers_stops_the_plan(tmp_path):
    make_checkpoint(tmp_path / "two", names=["sport", "tech"])
    with pytest.raises(KdpipeError, match=r"label 'politics' in the data is covered by no teacher"):
        load(edit=with_checkpoint(tmp_path / "two"))


def with_own_code(folder, model_type="my-bert"):
    """Mark a saved checkpoint as needing code of its own, as a hub model with custom modeling files is."""
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {
        "AutoConfig": "configuration_my.MyConfig",
        "AutoModelForSequenceClassification": "modeling_my.MyForSequenceClassification",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def own_code_message(folder, model_type="my-bert"):
    return (
        f"{folder}/config.json: the key auto_map asks for the checkpoint's own code (configuration_my.MyConfig, "
        f"modeling_my.MyForSequenceClassification), as transformers provides no sequence classifier for its "
        f"model_type '{model_type}'; kdpipe does not run a checkpoint's own code (trust_remote_code is off): use a "
        "checkpoint of a model class that transformers provides (a model_type such as bert, roberta or deberta-v2)"
    )


def test_a_checkpoint_needing_its_own_code_is_refused_for_that_reason(tmp_path):
    folder = tmp_path / "custom"
    make_checkpoint(folder)
    with_own_code(folder)
    for loader in (lambda: load_trained(folder), lambda: load_classifier(str(folder), ["sport", "tech"], seed=0)):
        with pytest.raises(KdpipeError) as err:
            loader()
        assert str(err.value) == own_code_message(folder)
    # before any job: as the checkpoint of a teacher, and as a student's backbone
    with pytest.raises(KdpipeError) as err:
        load(edit=with_checkpoint(folder))
    assert str(err.value) == f"teachers.tb.checkpoint: {own_code_message(folder)}"

    def student_from_it(config):
        config["students"]["s_vkd"]["model"] = {"init": {"from": str(folder), "layers": [0]}}

    with pytest.raises(KdpipeError, match=r"^students\.s_vkd\.model\.init\.from: .*config\.json: the key auto_map"):
        load(edit=student_from_it)


def test_an_auto_map_beside_a_model_type_transformers_provides_loads_as_that_class(tmp_path):
    folder = tmp_path / "known"
    original = make_checkpoint(folder)
    with_own_code(folder, model_type="bert")
    model = load_trained(folder)
    assert type(model).__name__ == "BertForSequenceClassification"
    assert torch.equal(head_weight(model), head_weight(original))
    assert load(edit=with_checkpoint(folder)).imported_teachers() == ["tb"]


# ---- the shape of a checkpoint teacher: read from the checkpoint, not the default backbone -------------------------

BBC = ["business", "entertainment", "politics", "sport", "tech"]
DEEP = "builtin:minilm-l6"  # the default backbone in these plans: 6 layers, 12 heads, not what the teacher runs
ONE_LAYER = {"config": {"tokenizer": "builtin:tiny-bert", "hidden_size": 32, "num_layers": 1, "num_heads": 2}}
TWO_LAYERS = {"config": {**ONE_LAYER["config"], "num_layers": 2}}


@pytest.fixture(scope="module")
def distilbert(tmp_path_factory):
    """A 2-layer, 2-head DistilBERT classifier over the BBC labels (its config says n_layers and n_heads)."""
    return tiny_distilbert(tmp_path_factory.mktemp("distilbert") / "clf", BBC)


def deep_default(folder, students, **teacher):
    """The tiny config with one teacher fine-tuned from ``folder`` and a default backbone of another depth."""

    def edit(config):
        config["teacher_defaults"]["backbone"] = DEEP
        config["teachers"] = {"ck": {"checkpoint": str(folder), "finetune": True, **teacher}}
        config["students"] = students
        config["evaluate"]["oracle"] = []

    return edit


def test_a_checkpoint_teacher_runs_the_checkpoint_and_a_plain_one_its_backbone(distilbert):
    plan = load(edit=deep_default(distilbert, {"s": {"method": "vanilla_kd"}}))
    assert plan.teacher_model("ck") == str(distilbert)
    assert (plan.teacher_layers("ck"), plan.teacher_heads("ck")) == (2, 2)
    imported = load(edit=deep_default(distilbert, {"s": {"method": "vanilla_kd"}}, finetune=False))
    assert (imported.teacher_layers("ck"), imported.teacher_heads("ck")) == (2, 2)
    subset = load(edit=deep_default(distilbert, {"s": {"method": "vanilla_kd"}}, layers=[1]))
    assert subset.teacher_layers("ck") == 1  # a layer subset of the checkpoint

    def plain(config):
        deep_default(distilbert, {"s": {"method": "vanilla_kd"}})(config)
        config["teachers"]["plain"] = {}

    mixed = load(edit=plain)
    assert mixed.teacher_model("plain") == DEEP
    assert (mixed.teacher_layers("plain"), mixed.teacher_heads("plain")) == (6, 12)


@pytest.mark.parametrize(
    "method, model, alignment",
    [
        ("dfa", ONE_LAYER, [[1, 2]]),  # strided from the top: student 1 <-> the checkpoint's last layer
        ("dfa", TWO_LAYERS, [[2, 2], [1, 1]]),
        ("dynamic_objective", ONE_LAYER, [[0, 0], [1, 2]]),  # uniform: l <-> 2l, not 6l
        ("dynamic_objective", TWO_LAYERS, [[0, 0], [1, 1], [2, 2]]),
    ],
)
def test_hidden_state_methods_align_with_the_checkpoints_layers(distilbert, method, model, alignment):
    plan = load(edit=deep_default(distilbert, {"s": {"method": method, "model": model}}))
    assert plan.student_params("s")["alignment"] == {"ck": alignment}
    layers = sorted({t for s, t in alignment})
    assert plan.feature_layers("ck", "hidden") == layers
    assert plan.signal_params("ck", "train", "hidden")["layers"] == layers
    assert max(layers) <= 2  # hidden states 0..2 of a 2-layer teacher


@pytest.mark.usefixtures("domain_csv")
def test_meta_kd_reads_the_checkpoints_layers_and_heads(tmp_path):
    folder = tiny_distilbert(tmp_path / "meta_ckpt", ["neg", "pos"])

    def edit(config):
        _meta_config(config)
        config["teacher_defaults"]["backbone"] = DEEP
        config["teachers"]["meta"].update(checkpoint=str(folder), finetune=True)
        per_head = config["students"]["s_meta"]["method_args"]["stage1"]
        per_head["attention_heads"] = "per_head"  # 2 heads like the checkpoint (the backbone has 12)

    plan = load(edit=edit)
    assert (plan.teacher_layers("meta"), plan.teacher_heads("meta")) == (2, 2)
    assert plan.teacher_layers("plain") == 6  # no checkpoint: the default backbone
    first = plan.student_params("s_meta.stage1")
    assert first["alignment"] == {"meta": [[0, 0], [1, 2]]} and first["attention_feature"] == "attentions"
    assert plan.student_params("s_meta_narrow.stage1")["attention_feature"] == "attentions_mean"  # a 1-head student
    assert plan.signal_params("meta", "train", "hidden")["layers"] == [0, 2]
    assert plan.signal_params("meta", "train", "attentions")["layers"] == [2]
    assert plan.signal_params("meta", "train", "attentions_mean")["layers"] == [2]

    def twelve_heads(config):  # as the default backbone has: per_head is refused against the checkpoint's 2
        edit(config)
        config["students"]["s_meta"]["model"] = {"config": {**ONE_LAYER["config"], "num_heads": 12, "hidden_size": 48}}

    with pytest.raises(KdpipeError, match=r"per_head, but the student has 12 heads and its teachers \[2\]"):
        load(edit=twelve_heads)


def test_the_feature_dump_of_a_checkpoint_teacher_keeps_the_layers_the_plan_asks_for(distilbert, tiny_data, tmp_path):
    """The plan's dump of a fine-tuned 2-layer checkpoint (the default backbone has 6) runs: hidden states the
    Dynamic KD objective needs, and the per-head attentions of its last layer."""
    plan = load(edit=deep_default(distilbert, {"s": {"method": "dynamic_objective", "model": ONE_LAYER}}))
    teacher = tmp_path / "teacher"
    finetune_teacher.run(
        teacher_settings({**TINY_TEACHER, "backbone": DEEP, "lr": 1e-12, "checkpoint": str(distilbert)}),
        tiny_data,
        teacher,
    )
    signals = tmp_path / "signals/ck/train"
    hidden = plan.signal_params("ck", "train", "hidden")
    assert hidden["layers"] == [0, 2]
    manifest = run_signal("hidden", hidden, teacher, tiny_data, signals)
    row_ids = read_split(tiny_data, "train")["row_id"].to_numpy()
    dump, _, tokens, _ = read_features(signals / "hidden.npy", row_ids, [0, 2])
    assert manifest["layers"] == [0, 2] and dump.shape == (tokens["length"].sum(), 2, 32)
    last = {**hidden, "signal": "attentions", "layers": [plan.teacher_layers("ck")]}
    maps = run_signal("attentions", last, teacher, tiny_data, signals)
    assert maps["heads"] == plan.teacher_heads("ck") and maps["layers"] == [plan.teacher_layers("ck")]
    assert read_features(signals / "attentions.npy", row_ids)[0].shape == ((tokens["length"] ** 2).sum() * 2,)


# ---- weights only in a pickle file ---------------------------------------------------------------------------------


def pickle_checkpoint(folder, other_objects=False):
    """A classifier checkpoint whose weights are only ``pytorch_model.bin``, as ``save_pretrained(...,
    safe_serialization=False)`` wrote it before transformers 5 (which writes safetensors whatever it is asked, so the
    pickle is written with ``torch.save`` of the state dict). ``other_objects``: with a numpy number beside the
    tensors, which torch refuses to unpickle with ``weights_only`` (the file of a training script)."""
    model = make_checkpoint(folder)
    model.save_pretrained(folder, safe_serialization=False)
    (folder / "model.safetensors").unlink(missing_ok=True)
    state = dict(model.state_dict())
    if other_objects:
        state["training_step"] = np.float64(1200.0)
    torch.save(state, folder / "pytorch_model.bin")
    assert sorted(p.name for p in folder.iterdir() if "model" in p.name) == ["pytorch_model.bin"]
    return model


def pickle_message(folder):
    return (
        f"{folder}: its weights are only in a pickle file (pytorch_model.bin), which kdpipe does not load (unpickling "
        "a file can run code); convert the folder to safetensors once, in a Python session you trust: `from "
        f"transformers import BertForSequenceClassification; BertForSequenceClassification.from_pretrained('{folder}')"
        f".save_pretrained('{folder}', safe_serialization=True)` writes model.safetensors beside it"
    )


@pytest.mark.parametrize("other_objects", [False, True])
def test_a_checkpoint_only_in_a_pickle_file_is_refused_in_one_line_before_any_job(tmp_path, other_objects):
    folder = tmp_path / "pickled"
    pickle_checkpoint(folder, other_objects)
    for loader in (lambda: load_trained(folder), lambda: load_classifier(str(folder), ["sport", "tech"], seed=0)):
        with pytest.raises(KdpipeError) as err:
            loader()
        assert str(err.value) == pickle_message(folder)  # one line, nothing read from the pickle
    with pytest.raises(KdpipeError) as err:
        load(edit=with_checkpoint(folder))
    assert str(err.value) == f"teachers.tb.checkpoint: {pickle_message(folder)}"

    def student_from_it(config):
        config["students"]["s_vkd"]["model"] = {"init": {"from": str(folder), "layers": [0]}}

    with pytest.raises(KdpipeError, match=r"^students\.s_vkd\.model\.init\.from: .*pytorch_model\.bin\), which kdp"):
        load(edit=student_from_it)


def test_the_conversion_the_refusal_gives_makes_a_checkpoint_kdpipe_loads(tmp_path):
    """The command in the message, run as it is, gives a folder that loads with the same weights and that the plan
    accepts."""
    folder = tmp_path / "pickled"
    original = pickle_checkpoint(folder)
    with pytest.raises(KdpipeError) as err:
        load_trained(folder)
    exec(re.search(r"`([^`]+)`", str(err.value)).group(1))
    assert (folder / "model.safetensors").is_file()
    assert torch.equal(head_weight(load_trained(folder)), head_weight(original))
    assert load(edit=with_checkpoint(folder)).imported_teachers() == ["tb"]
