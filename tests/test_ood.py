"""Out-of-distribution evaluation (docs/methods.md, "Judging uncertainty"): the detection and selective-prediction
metrics against hand-computed values, the held-out classes in the prepared data, the external OOD set, MC-dropout at
evaluation, and every bad input named before any job."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import OOD, read_labels, read_split
from kdpipe.data.ood import build_ood
from kdpipe.data.prepare import prepare
from kdpipe.data.settings import OodSourceSettings
from kdpipe.evaluation.metrics import uncertainty_split
from kdpipe.evaluation.ood import detection, risk_coverage, scores, selective
from kdpipe.evaluation.settings import EvalSettings
from kdpipe.models.inference import mc_member_logits
from tests.test_data import dataset_params, tiny_frame, write_table
from tests.test_plan import load
from tests.test_transfer import transfer_settings

# ---- metrics


def test_detection_matches_hand_counts():
    # in-distribution 1, 2, 3, 4; OOD 3.5, 5 (larger = more OOD). Pairs (OOD > in): 3.5 beats 3 of 4, 5 beats 4 of
    # 4, so AUROC = 7/8. Ranked: 5 (OOD), 4, 3.5 (OOD), ...: precision 1/1 at recall 1/2, 2/3 at recall 1, so
    # AP = 1/2 + 1/2 * 2/3 = 5/6. Flagging both OOD rows (threshold 3.5) flags the in-distribution 4: FPR 1/4.
    result = detection(np.array([1.0, 2, 3, 4]), np.array([3.5, 5]))
    assert result["auroc"] == pytest.approx(7 / 8)
    assert result["aupr"] == pytest.approx(5 / 6)
    assert result["fpr95"] == pytest.approx(1 / 4)
    assert result["roc"]["fpr"][0] == 0 and result["roc"]["tpr"][-1] == 1


def test_detection_of_a_perfect_and_a_useless_score():
    perfect = detection(np.zeros(5), np.ones(3))
    assert (perfect["auroc"], perfect["fpr95"]) == (1.0, 0.0)
    useless = detection(np.ones(4), np.ones(4))  # every row tied
    assert useless["auroc"] == 0.5 and useless["fpr95"] == 1.0
    with pytest.raises(KdpipeError, match="rows on both sides"):
        detection(np.ones(3), np.array([]))


def test_risk_coverage_and_aurc_by_hand():
    # kept most sure first: 0.1 (right), 0.3 (right), 0.5 (wrong), 0.9 (wrong): risk 0, 0, 1/3, 1/2
    coverage, risk = risk_coverage(np.array([0.1, 0.5, 0.3, 0.9]), np.array([True, False, True, False]))
    np.testing.assert_allclose(coverage, [0.25, 0.5, 0.75, 1.0])
    np.testing.assert_allclose(risk, [0, 0, 1 / 3, 1 / 2])
    result = selective({"max_prob": np.array([0.1, 0.5, 0.3, 0.9])}, np.array([True, False, True, False]))
    assert result["aurc"]["max_prob"] == pytest.approx((1 / 3 + 1 / 2) / 4)
    assert result["curve"]["risk"][-1] == 0.5


def test_scores_orient_max_prob_and_split_members():
    members = np.array([[[0.9, 0.1], [0.5, 0.5]], [[0.7, 0.3], [0.5, 0.5]]])  # [M = 2, N = 2, C = 2]
    got = scores(members, "mc_")
    split = uncertainty_split(members)
    np.testing.assert_allclose(got["mc_max_prob"], [-0.8, -0.5])  # larger = less sure
    np.testing.assert_allclose(got["mc_mutual_info"], split["epistemic"])
    np.testing.assert_allclose(got["mc_expected_entropy"], split["aleatoric"])
    assert set(scores(members[:1])) == {"max_prob", "entropy"}  # one member: no epistemic part to score


# ---- the held-out classes in the prepared data


def three_classes(tmp_path, **overrides):
    path = write_table(tiny_frame(60, labels=("neg", "pos", "mid")), tmp_path / "d.csv")
    return dataset_params(source=path, split={"validation": 0.2, "test": 0.2, "seed": 1}, **overrides)


def ood_settings(source, text_column: str = "text") -> OodSourceSettings:
    """The ``ood`` job's settings of an external OOD file of the tiny dataset."""
    params = {"name": "tiny", "source": str(source), "text_column": text_column, "text_pair_column": None}
    return OodSourceSettings.from_params(params | {"format": "auto", "encoding": "utf-8"}, "ood")


def eval_settings(**params) -> EvalSettings:
    """An evaluation's settings: a teacher's, evaluated on test and the OOD rows, but for ``params``."""
    base = {"model": "t", "base": "t", "kind": "teacher", "method": None, "seed": 0, "splits": ["test", OOD]}
    return EvalSettings.from_params(base | {"batch_size": 8, "ece_bins": 5} | params, "evaluate")


def test_held_out_class_leaves_train_and_validation_and_its_test_rows_are_the_ood_split(tmp_path):
    params = three_classes(tmp_path, ood_classes=["mid"])
    manifest = prepare(params, tmp_path / "data")
    assert read_labels(tmp_path / "data") == ["neg", "pos"]
    for split in ("train", "validation", "test"):
        assert set(read_split(tmp_path / "data", split)["label"]) == {"neg", "pos"}
    ood = read_split(tmp_path / "data", OOD)
    assert set(ood["label"]) == {"mid"} and len(ood) == manifest["ood"]["rows"] == 4
    assert manifest["ood"]["removed"] == {"train": 12, "validation": 4}
    # every other class keeps the rows it has without the hold-out
    plain = prepare(three_classes(tmp_path), tmp_path / "plain")
    assert plain["class_counts"]["train"]["neg"] == manifest["class_counts"]["train"]["neg"]


@pytest.mark.parametrize(
    ("held", "message"),
    [(["middle"], "'middle' is not a class of .*did you mean 'mid'"), (["mid", "pos"], "leaves 1 class")],
)
def test_held_out_classes_that_cannot_work_are_named(tmp_path, held, message):
    with pytest.raises(KdpipeError, match=message):
        prepare(three_classes(tmp_path, ood_classes=held), tmp_path / "data")


def test_external_ood_set_drops_empty_repeated_and_dataset_texts(tmp_path):
    params = three_classes(tmp_path)
    prepare(params, tmp_path / "data")
    texts = ["a dispatch from nowhere", "a dispatch from nowhere", "", "SENTENCE number 3", "another one"]
    source = write_table(pd.DataFrame({"body": texts}), tmp_path / "ood.csv")
    manifest = build_ood(ood_settings(source, "body"), tmp_path / "data", tmp_path / "ood")
    assert manifest["dropped"] == {
        "empty": 1,
        "duplicate": 1,
        "dataset": 1,
        "evaluation_shared": 0,
        "evaluation_contained": 0,
    }
    rows = read_split(tmp_path / "ood", OOD)
    assert rows["text"].tolist() == ["a dispatch from nowhere", "another one"]
    assert rows["row_id"].min() > read_split(tmp_path / "data", "train")["row_id"].max()
    with pytest.raises(KdpipeError, match=r"no column 'text' \(evaluate.ood.text_column\)"):
        build_ood(ood_settings(source), tmp_path / "data", tmp_path / "ood2")


# ---- MC-dropout at evaluation


def test_mc_member_logits_differ_by_sample_repeat_by_seed_and_leave_eval_mode():
    from kdpipe.data.batching import encode_frame
    from kdpipe.models.loading import load_classifier, load_tokenizer

    tokenizer = load_tokenizer("builtin:tiny-bert")
    model = load_classifier("builtin:tiny-bert", ["a", "b", "c"], seed=0)
    encoded = encode_frame(tokenizer, tiny_frame(6).assign(row_id=range(6)), max_length=16)
    kwargs = {"samples": 3, "batch_size": 4, "device": torch.device("cpu")}
    first = mc_member_logits(model, encoded, seed=5, **kwargs)
    assert first.shape == (3, 6, 3)
    assert not np.allclose(first[0], first[1])
    np.testing.assert_array_equal(first, mc_member_logits(model, encoded, seed=5, **kwargs))
    assert not model.training and not any(m.training for m in model.modules())


# ---- bad input, before any job


def ood_config(**evaluate):
    def edit(config):
        config["evaluate"] = {**config.get("evaluate", {}), "splits": ["validation", "test"], **evaluate}

    return edit


@pytest.mark.parametrize(
    ("evaluate", "message"),
    [
        ({"ood": {"classes": ["tech"], "source": "x.csv"}}, "not both"),
        ({"ood": {"classes": ["tech"]}, "splits": ["validation"]}, "add test"),
        ({"ood": {"source": "no/such/file.csv"}}, "file not found"),
        ({"ood": {"classes": ["tech"], "text_column": "body"}}, "only an OOD source file"),
        ({"ood": {"classes": ["business", "entertainment", "politics", "sport"]}}, "leaves 1 class"),
    ],
)
def test_bad_ood_settings_stop_the_plan(evaluate, message):
    with pytest.raises(KdpipeError, match=message):
        load(edit=ood_config(**evaluate))


def test_a_teacher_that_names_a_held_out_class_or_would_keep_one_class_stops_the_plan():
    def names_it(config):
        ood_config(ood={"classes": ["tech"]})(config)
        config["teachers"]["ta"]["classes"] = ["business", "tech"]

    with pytest.raises(KdpipeError, match=r"teachers.ta.classes: 'tech' is held out"):
        load(edit=names_it)

    def three_slices(config):  # four classes left in three slices: one teacher with a single class
        ood_config(ood={"classes": ["tech"]})(config)
        config["teachers"] = {f"t{i}": {"classes": {"slice": i, "of": 3}, "epochs": 1} for i in range(3)}
        config["students"] = {"s_none": config["students"]["s_none"]}
        config["evaluate"].pop("oracle", None)

    with pytest.raises(KdpipeError, match="left with 1 class"):
        load(edit=three_slices)


def test_mc_samples_on_a_model_without_dropout_stops_the_plan(tmp_path):
    folder = tmp_path / "nodrop"
    folder.mkdir()
    config = {"model_type": "bert", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    (folder / "config.json").write_text(json.dumps(config))

    def no_dropout(config):
        ood_config(mc_samples=4)(config)
        config["teachers"]["ta"]["backbone"] = str(folder)

    with pytest.raises(KdpipeError, match=r"teachers.ta: .* has no dropout .*evaluate.mc_samples"):
        load(edit=no_dropout)


def test_ood_and_mc_samples_enter_only_the_evaluation_slices_that_use_them():
    plain = load()
    held = load(edit=ood_config(ood={"classes": ["tech"]}, mc_samples=4))
    assert "ood" not in plain.eval_params("s_vkd") and "mc_samples" not in plain.eval_params("s_vkd")
    assert held.eval_params("s_vkd")["splits"] == ["validation", "test", OOD]
    assert held.eval_params("s_vkd")["mc_samples"] == 4
    assert "mc_samples" not in held.eval_params("oracle")  # made from its members' predictions
    assert held.prepare_params()["ood_classes"] == ["tech"] and "ood_classes" not in plain.prepare_params()
    assert held.teacher_classes("ta") == ["business", "entertainment"]
    assert "tech" not in held.teacher_classes("tb")


# ---- what an outside break-it pass found


def member_files(tmp_path, name, classes, test_rows, ood_rows, rng):
    """One member's test and ood evaluations, written as the evaluate stage writes them."""
    from kdpipe.evaluation.results import write_evaluation, write_ood

    settings = eval_settings(model=name, base=name, ood={"classes": ["tech"]})
    folder = tmp_path / name
    folder.mkdir()
    test = rng.dirichlet(np.ones(len(classes)), test_rows)[None]
    ood = rng.dirichlet(np.ones(len(classes)), ood_rows)[None]
    y = rng.integers(0, len(classes), test_rows)
    ids = np.arange(test_rows) + (100 if name == "tb" else 0)
    extra = {"gold_labels": {"train": 10}, "params": 100, "train_time_s": 1.0, "inference_time_s": 0.1}
    write_evaluation(
        settings, "test", test, y, classes, ids, extra, folder / "test.json", folder / "test.predictions.parquet"
    )
    rows = pd.DataFrame({"row_id": 1000 + np.arange(ood_rows), "label": ["tech"] * ood_rows})
    write_ood(settings, test, ood, rows, classes, extra, folder / "ood.json", folder / "ood.predictions.parquet", 0.5)
    return folder


def test_the_oracle_has_no_ood_scores_says_why_and_the_report_lists_it(tmp_path):
    from kdpipe.report import build_report
    from kdpipe.stages import evaluate_ensemble

    rng = np.random.default_rng(0)
    ta = member_files(tmp_path, "ta", ["business", "entertainment"], 6, 3, rng)
    tb = member_files(tmp_path, "tb", ["politics", "sport"], 4, 3, rng)
    out = tmp_path / "oracle"
    out.mkdir()
    oracle = {"model": "oracle", "base": "oracle", "kind": "oracle", "seed": None, "members": ["ta", "tb"]}
    params = eval_settings(**oracle, combine="oracle", ood={"classes": ["tech"]})
    members = [ta / "test.predictions.parquet", tb / "test.predictions.parquet"]
    members += [ta / "ood.predictions.parquet", tb / "ood.predictions.parquet"]
    jsons = [out / "test.json", out / "ood.json"]
    evaluate_ensemble.run(params, members, jsons, [out / "test.predictions.parquet", out / "ood.predictions.parquet"])
    record = json.loads((out / "ood.json").read_text())
    assert record["ood"]["scores"] is None and "gold class" in record["ood"]["reason"]
    assert record["classes"] == ["business", "entertainment", "politics", "sport"]
    evals = [ta / "test.json", ta / "ood.json", tb / "test.json", tb / "ood.json", *jsons]
    build_report(evals, tmp_path / "report")
    assert "oracle" in (tmp_path / "report/ood.md").read_text()


def test_stale_evaluations_of_splits_no_longer_evaluated_are_removed(tmp_path):
    from kdpipe.evaluation.results import remove_stale

    for name in ("validation.json", "ood.json", "ood.predictions.parquet", "test.json"):
        (tmp_path / name).write_text("{}")
    remove_stale(tmp_path, ["validation", "test"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.json", "validation.json"]


def test_transfer_rows_never_hold_an_ood_text(tmp_path):
    from kdpipe.data.transfer import build_transfer

    params = three_classes(tmp_path, ood_classes=["mid"])
    prepare(params, tmp_path / "data")
    ood_text = read_split(tmp_path / "data", OOD)["text"].iloc[0]
    extra = write_table(pd.DataFrame({"text": [ood_text, "a new unlabelled text"]}), tmp_path / "extra.csv")
    manifest = build_transfer(transfer_settings(extra), tmp_path / "data", tmp_path / "transfer")
    assert manifest["rows"]["transfer"] == 1 and manifest["dropped"]["evaluation"] == 1


def test_no_row_of_a_held_out_class_reaches_the_transfer_rows_from_any_split(tmp_path):
    """The held-out classes' training, validation and withheld rows are evaluation texts as their test rows are:
    a transfer file that copies them (in capitals, for one) loses every such row, counted as evaluation."""
    from kdpipe.data.prepare import HELD_OUT
    from kdpipe.data.transfer import build_transfer

    source = write_table(tiny_frame(80, labels=("neg", "pos", "mid")), tmp_path / "d.csv")
    split = {"validation": 0.2, "test": 0.2, "seed": 1, "unlabelled": 0.25}
    params = dataset_params(source=source, split=split, ood_classes=["mid"])
    manifest = prepare(params, tmp_path / "data")
    held = pd.read_parquet(tmp_path / "data" / HELD_OUT)
    assert set(held["label"]) == {"mid"} and len(held) == sum(manifest["ood"]["removed"].values())
    assert set(manifest["ood"]["removed"]) == {"train", "validation", "unlabelled"}
    every_mid = pd.concat([held["text"], read_split(tmp_path / "data", OOD)["text"]])
    texts = [*every_mid.str.upper(), "a new unlabelled text"]
    extra = write_table(pd.DataFrame({"text": texts}), tmp_path / "extra.csv")
    built = build_transfer(transfer_settings(extra), tmp_path / "data", tmp_path / "transfer")
    kept = read_split(tmp_path / "transfer", "transfer")["text"]
    assert built["dropped"]["evaluation"] == len(every_mid) == 26  # every "mid" row of the 80
    assert set(kept) & set(every_mid.str.upper()) == set() and "a new unlabelled text" in set(kept)
    assert not set(kept) & set(every_mid)  # the withheld rows kept as transfer rows are of the other classes only


@pytest.mark.parametrize("cap", [{"max_per_class": 8}, {"max_rows": 30}])
def test_held_out_class_rows_that_a_cap_or_a_conflict_removed_are_evaluation_texts_too(tmp_path, cap):
    """Rows of a held-out class that max_per_class or max_rows left out, or that a conflict dropped, are in no split,
    yet they are known texts of the unseen class: held_out.parquet keeps them (row_id -1), so a transfer file or an
    external OOD set that copies one loses it."""
    from kdpipe.data.prepare import HELD_OUT
    from kdpipe.data.transfer import build_transfer

    frame = tiny_frame(60, labels=("neg", "pos", "mid"))
    frame.loc[len(frame)] = ("a text both neg and mid", "neg")
    frame.loc[len(frame)] = ("A text both neg and MID", "mid")  # a conflict: both copies dropped
    source = write_table(frame, tmp_path / "d.csv")
    params = dataset_params(
        source=source, split={"validation": 0.2, "test": 0.2, "seed": 1}, ood_classes=["mid"], **cap
    )
    manifest = prepare(params, tmp_path / "data")
    held = pd.read_parquet(tmp_path / "data" / HELD_OUT)
    every_mid = frame[frame["label"] == "mid"]["text"]
    outside = held[held["row_id"] == -1]
    assert len(outside) == manifest["ood"]["removed"]["before_hold_out"] and len(held) == len(set(held["text"]))
    assert "A text both neg and MID" in set(outside["text"]) and set(held["label"]) == {"mid"}
    ood = read_split(tmp_path / "data", OOD)
    assert set(every_mid) == set(held["text"]) | set(ood["text"])  # every "mid" text as read, once
    assert len(held) == sum(manifest["ood"]["removed"].values())
    extra = write_table(pd.DataFrame({"text": [*every_mid.str.upper(), "a new unlabelled text"]}), tmp_path / "x.csv")
    built = build_transfer(transfer_settings(extra), tmp_path / "data", tmp_path / "transfer")
    assert built["dropped"]["evaluation"] == len(every_mid) == 21
    assert read_split(tmp_path / "transfer", "transfer")["text"].tolist() == ["a new unlabelled text"]
    copied = outside["text"].iloc[0]
    source = write_table(pd.DataFrame({"text": [copied, "never seen"]}), tmp_path / "o.csv")
    assert build_ood(ood_settings(source), tmp_path / "data", tmp_path / "ood")["dropped"]["dataset"] == 1


def test_an_external_ood_set_drops_a_copy_of_a_held_out_classs_training_text(tmp_path):
    params = three_classes(tmp_path, ood_classes=["mid"])
    prepare(params, tmp_path / "data")
    from kdpipe.data.prepare import HELD_OUT

    copied = pd.read_parquet(tmp_path / "data" / HELD_OUT)["text"].iloc[0]
    source = write_table(pd.DataFrame({"body": [copied, "never seen"]}), tmp_path / "ood.csv")
    assert build_ood(ood_settings(source, "body"), tmp_path / "data", tmp_path / "ood")["dropped"]["dataset"] == 1
    assert read_split(tmp_path / "ood", OOD)["text"].tolist() == ["never seen"]


@pytest.mark.parametrize(
    ("content", "name", "message"),
    [
        ("body\nsome text\n", "ood.csv", r"no column 'text' \(dataset.text_column\).*\(evaluate.ood.source\)"),
        ("text\n", "ood.csv", "only a header"),
        ("just a line\n", "ood.txt", "by its extension"),
        (None, "folder", "not one written by the datasets library"),
    ],
)
def test_an_ood_file_that_cannot_be_read_stops_the_plan(tmp_path, content, name, message):
    path = tmp_path / name
    if content is None:
        path.mkdir()
    else:
        path.write_text(content)
    with pytest.raises(KdpipeError, match=message):
        load(edit=ood_config(ood={"source": str(path)}))
    if name == "ood.csv" and "body" in content:  # the column the config names, under the key that names it
        with pytest.raises(KdpipeError, match=r"no column 'article' \(evaluate.ood.text_column\)"):
            load(edit=ood_config(ood={"source": str(path), "text_column": "article"}))


def test_a_student_or_prokt_backbone_that_already_predicts_a_held_out_class_stops_the_plan(tmp_path):
    """As a teacher checkpoint is (kdpipe/plan/ood.py): a student starting from a classifier of the held-out class,
    or a ProKT teacher co-trained from one, has already learnt it; one line names the key and the class."""
    from tests.test_checkpoint_teachers import make_checkpoint

    knows, other = tmp_path / "knows_tech", tmp_path / "no_tech"
    make_checkpoint(knows, ["business", "Tech"])  # case ignored, as for a teacher's head
    make_checkpoint(other, ["business", "sport"])

    def started_from(folder, prokt=False):
        def edit(config):
            ood_config(ood={"classes": ["tech"]})(config)
            if prokt:
                config["students"] = {"s_p": {"method": "prokt", "method_args": {"backbone": str(folder)}}}
            else:
                config["students"]["s_vkd"]["model"] = {"init": {"from": str(folder)}}

        return edit

    with pytest.raises(KdpipeError) as err:
        load(edit=started_from(knows))
    assert str(err.value) == (
        f"students.s_vkd.model.init.from: {knows} already predicts 'Tech', which evaluate.ood.classes holds out as "
        "unseen; hold out a class it never learnt, or start from another model"
    )
    with pytest.raises(KdpipeError, match=r"^students\.s_p\.method_args\.backbone: .* already predicts 'Tech'"):
        load(edit=started_from(knows, prokt=True))
    assert load(edit=started_from(other)).ood_classes() == ["tech"]  # a classifier of other classes starts a student
    assert load(edit=started_from(other, prokt=True)).ood_classes() == ["tech"]
