"""Routers, calibration and routing diagnostics (docs/routing.md) against hand-computed values."""

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from kdpipe.core.store import KdpipeError
from kdpipe.routing import RouteSpec, route_spec
from kdpipe.routing.certainty import certainty_scores
from kdpipe.routing.diagnostics import (
    OOD_MC_SCORES,
    misrouted,
    ood_auroc,
    routing_accuracy,
    suggestion,
    target_accuracy,
    teacher_ood,
    warning,
)
from kdpipe.routing.inputs import RouteInputs
from kdpipe.routing.knn import fold_assignment, knn_scores, kth_distance, normalise, percentile
from kdpipe.routing.learned import learned_router
from kdpipe.routing.scoring import fit_temperature
from kdpipe.routing.settings import RouteSettings
from tests.conftest import student_settings

LN3 = math.log(3)


def test_certainty_scores_by_hand():
    logits = np.array([[LN3, 0.0], [0.0, 0.0]], np.float32)  # (¾, ¼) and (½, ½)
    table = pd.DataFrame({"certainty": [0.3, 0.9], "max_prob": [0.6, 0.8], "mutual_info": [0.05, 0.2]})
    mc = np.array([[0.75, 0.25], [0.5, 0.5]], np.float32)
    h = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25)) / math.log(2)
    assert certainty_scores("logit_entropy", logits=logits).tolist() == pytest.approx([1 - h, 0.0], abs=1e-6)
    assert certainty_scores("logit_max_prob", logits=logits).tolist() == pytest.approx([0.75, 0.5], abs=1e-6)
    # energy log Σ exp z: log(3 + 1) and log 2
    assert certainty_scores("energy", logits=logits).tolist() == pytest.approx([math.log(4), math.log(2)], abs=1e-6)
    # at τ = 2 energy is 2·log Σ exp(z/2)
    energy_2 = certainty_scores("energy", logits=logits, temperature=2.0)[0].item()
    assert energy_2 == pytest.approx(2 * math.log(math.sqrt(3) + 1), abs=1e-6)
    # the MC scores are the cached columns, bit for bit; mutual information is negated (lower is more certain)
    assert (
        certainty_scores("entropy", logits=logits, mc_probs=mc, mc_table=table).numpy().tobytes()
        == np.array([0.3, 0.9], np.float32).tobytes()
    )
    assert certainty_scores("max_prob", logits=logits, mc_table=table).tolist() == pytest.approx([0.6, 0.8])
    assert certainty_scores("mutual_info", logits=logits, mc_table=table).tolist() == pytest.approx([-0.05, -0.2])
    with pytest.raises(ValueError, match="needs the MC-dropout signal"):
        certainty_scores("entropy", logits=logits)


def test_calibrated_scores_temper_the_distribution():
    logits = np.array([[2 * LN3, 0.0]], np.float32)
    # T = 2: softmax((2ln3, 0) / 2) = (¾, ¼)
    assert certainty_scores("logit_max_prob", logits=logits, calibration=2.0).item() == pytest.approx(0.75)
    # the MC mean (¾, ¼) at T = ½: softmax(2·log p) ∝ (9/16, 1/16) -> (0.9, 0.1)
    mc = np.array([[0.75, 0.25]], np.float32)
    table = pd.DataFrame({"certainty": [0.0], "max_prob": [0.75]})
    score = certainty_scores("max_prob", logits=logits, mc_probs=mc, mc_table=table, calibration=0.5)
    assert score.item() == pytest.approx(0.9, abs=1e-6)


def test_fit_temperature_by_hand():
    # four rows with logits (2, 0), three of class 0: the NLL is least where sigmoid(2/T) = ¾, i.e. T = 2/ln 3
    logits = np.array([[2.0, 0.0]] * 4)
    fit = fit_temperature(logits, np.array([0, 0, 0, 1]))
    assert fit["temperature"] == pytest.approx(2 / LN3, rel=1e-3)
    assert fit["nll_calibrated"] < fit["nll"]
    assert fit_temperature(logits[:0], np.array([], int))["temperature"] == 1.0  # no own rows: left as is


def test_kth_distance_leaves_the_row_itself_out():
    train = normalise(np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]]))
    own = train[:2]
    # rows 0 and 1 are the reference's rows 0 and 1: each one's nearest other row is the other (cos 0.8)
    distances = kth_distance(train, own, 1, np.array([0, 1, -1]))
    assert distances.tolist() == pytest.approx([0.2, 0.2, 0.4], abs=1e-6)  # row 2: 1 − cos((0,1), (0.8,0.6))
    # k = 2 for row 2 (not in the reference): the farther of the two
    assert kth_distance(train[2:], own, 2, None).tolist() == pytest.approx([1.0], abs=1e-6)


def test_knn_scores_are_percentiles_among_the_teachers_own_validation_rows():
    # own validation rows 0, 1, 3: (1, 0), (0.8, 0.6), (1, 0); each one's distance to its nearest other: 0, 0.2, 0
    validation = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [2.0, 0.0]])
    own = np.array([1, 1, 0, 1], bool)
    train = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]])  # nearest reference: 0, 1 − 0.96, 1 − 0.6
    s_train, s_val = knn_scores(train, validation, own, 1, folds=2, seed=0)
    # a score is the share of the reference distances {0, 0.2, 0} at least the row's distance
    assert s_train.tolist() == pytest.approx([1.0, 1 / 3, 0.0])
    assert percentile(np.array([0.1]), np.array([0.1, 0.2, 0.05, 0.3])).tolist() == pytest.approx([0.75])
    assert s_val.shape == (4,) and ((s_val >= 0) & (s_val <= 1)).all()


def test_knn_reads_no_train_label_and_no_validation_row_is_scored_with_its_own_label():
    rng = np.random.default_rng(1)
    validation, train = rng.normal(size=(40, 4)), rng.normal(size=(30, 4))
    own = rng.random(40) < 0.5
    s_train, s_val = knn_scores(train, validation, own, 3, folds=5, seed=7)
    for row in (0, 13, 39):  # flip one validation row's label: only the other rows' scores may move
        flipped = own.copy()
        flipped[row] = not flipped[row]
        _, s_val_flipped = knn_scores(train, validation, flipped, 3, folds=5, seed=7)
        assert s_val_flipped[row] == s_val[row]
    # every fold holds rows, and each row is in one fold
    folds = fold_assignment(40, 5, 7)
    assert sorted(np.bincount(folds).tolist()) == [8] * 5


def test_learned_router_routes_separable_rows_and_is_cross_fitted():
    rng = np.random.default_rng(0)
    features = rng.normal(size=(80, 3))
    owners = (features[:, 0] > 0).astype(int)
    train, validation, figures = learned_router(features, owners, features, 2, folds=4, seed=0)
    assert train.shape == (80, 2) and np.allclose(train.sum(1), 1.0, atol=1e-6)
    assert (validation.argmax(1) == owners).mean() > 0.9
    assert figures["folds"] == 4 and figures["C"] > 0
    # owners that the features cannot predict: in-sample the wide model fits them, cross-fitted it is at chance
    noise = rng.normal(size=(60, 80))
    random_owners = rng.integers(0, 2, 60)
    in_sample, crossfit, _ = learned_router(noise, random_owners, noise, 2, folds=4, seed=0)
    assert (crossfit.argmax(1) == random_owners).mean() < 0.75


def test_learned_router_needs_validation_rows_of_every_teacher():
    with pytest.raises(KdpipeError, match="at least 2 validation rows of every teacher"):
        learned_router(np.zeros((5, 2)), np.array([0, 0, 0, 0, 1]), np.zeros((3, 2)), 2, folds=5, seed=0)


LABELS = ["a", "b", "c"]


def test_routing_and_target_accuracy_by_hand():
    # teacher 0 owns a, b; teacher 1 owns c. Four rows of gold a, b, c, c
    gold = np.array([0, 1, 2, 2])
    owners = np.array([0, 0, 1, 1])
    scores = np.array([[0.9, 0.1], [0.2, 0.8], [0.3, 0.7], [0.6, 0.4]])
    routed = routing_accuracy(scores, owners, gold, LABELS)
    assert routed["accuracy"] == 0.5
    assert routed["per_class"] == {"a": 1.0, "b": 0.0, "c": 0.5}
    # each teacher's predicted class (student label index): teacher 0 says a, a, b, a; teacher 1 always c
    predictions = np.array([[0, 2], [0, 2], [1, 2], [0, 2]])
    target = target_accuracy(scores, predictions, gold, LABELS)
    assert target["accuracy"] == 0.5  # row 0 (a via teacher 0) and row 2 (c via teacher 1)
    assert misrouted(routed["per_class"], 0.8) == ["b", "c"]


def test_warning_names_the_misrouted_classes_and_a_better_router():
    def entry(accuracy, per_class, gold=False):
        return {"gold_labels": gold, "validation": {"routing": {"accuracy": accuracy, "per_class": per_class}}}

    diagnostics = {
        "certainty/entropy": entry(0.6, {"a": 0.9, "b": 0.3}),
        "knn": entry(0.95, {"a": 0.95, "b": 0.95}),
        "learned": entry(0.93, {"a": 0.93, "b": 0.93}, gold=True),
        "oracle": entry(1.0, {"a": 1.0, "b": 1.0}, gold=True),
    }
    text = warning(diagnostics, "certainty/entropy", 0.8)
    assert "60% of validation rows" in text and "wrong teacher: 70% of b" in text and "Router knn routes 95%" in text
    assert text.endswith("method_args: {router: knn} (docs/routing.md)")
    assert warning(diagnostics, "knn", 0.8) is None
    # a certainty router is suggested with its score, and a calibrated route's suggestion keeps calibrate
    diagnostics["certainty/logit_entropy"] = entry(0.97, {"a": 0.97, "b": 0.97})
    text = warning(diagnostics, "certainty/entropy", 0.8, calibrate=True)
    assert "Router certainty/logit_entropy routes 97%" in text
    assert text.endswith("method_args: {router: certainty, score: logit_entropy, calibrate: true} (docs/routing.md)")
    assert warning(diagnostics, "certainty/entropy", 0.5) is None  # the threshold decides, nothing else


def test_the_suggestion_is_method_args_that_choose_the_router():
    assert suggestion("knn") == "{router: knn}"
    assert suggestion("certainty/energy") == "{router: certainty, score: energy}"
    assert suggestion("learned", calibrate=True) == "{router: learned, calibrate: true}"
    args = yaml.safe_load(suggestion("certainty/logit_entropy", calibrate=True))
    assert route_spec(**{**args, "temperature": 1.0}).to_dict() == {
        "router": "certainty",
        "score": "logit_entropy",
        "temperature": 1.0,
        "calibrate": True,
    }


def test_a_route_opens_only_the_signals_it_declares(tmp_path, monkeypatch):
    """A signal file that exists but is not among the route's declared inputs is never opened: an MC-dropout
    signal made for another split, or left from an earlier config, is not read by a route that does not declare
    it."""
    from kdpipe.routing import inputs as module

    declared = RouteSpec("certainty", "logit_entropy").signals(mc_splits=["train"])
    assert declared == {"train": ["logits", "pooled", "mc"], "validation": ["logits", "pooled"]}
    for teacher in ("ta", "tb"):
        for split in ("train", "validation"):
            (tmp_path / teacher / split).mkdir(parents=True)
            (tmp_path / teacher / split / "mc.npy").write_bytes(b"")  # present on disk on both splits

    # the route's inputs read exactly the declared files: logits and pooled on both splits, mc on train only
    opened = []
    classes = {"ta": ["a", "b"], "tb": ["c"]}
    frames = {s: pd.DataFrame({"row_id": [0, 1, 2], "label_id": [0, 1, 2]}) for s in ("train", "validation")}
    monkeypatch.setattr(module, "read_labels", lambda data: ["a", "b", "c"])
    monkeypatch.setattr(module, "read_split", lambda data, split: frames[split])

    def reader(kind):
        def read(path, row_ids, *args):
            path = Path(path).relative_to(tmp_path)
            opened.append(str(path))
            labels = classes[path.parts[0]]
            if kind == "mc":
                return np.full((3, len(labels)), 0.5), pd.DataFrame({"row_id": row_ids, "certainty": 0.0})
            return np.zeros((3, len(labels) if kind == "logits" else 4), np.float32), labels

        return read

    for kind in ("logits", "pooled", "mc"):
        monkeypatch.setattr(module, f"read_{kind}", reader(kind))
    inputs = RouteInputs(["ta", "tb"], tmp_path / "data", tmp_path, declared)
    assert sorted(opened) == sorted(
        f"{t}/{split}/{name}"
        for t in ("ta", "tb")
        for split, names in (
            ("train", ("logits.parquet", "pooled.npy", "mc.npy")),
            ("validation", ("logits.parquet", "pooled.npy")),
        )
        for name in names
    )
    assert inputs.has_mc("train") and not inputs.has_mc("validation")
    assert set(inputs.mc) == {("ta", "train"), ("tb", "train")}
    assert inputs.signal_path("ta", "train", "mc") == tmp_path / "ta/train/mc.npy"
    with pytest.raises(KdpipeError, match="mc signal of ta on validation is not among the route's declared inputs"):
        inputs.signal_path("ta", "validation", "mc")
    with pytest.raises(KdpipeError, match="hidden signal of tb on train"):
        inputs.signal_path("tb", "train", "hidden")


def test_route_names_say_what_routes():
    args = {"router": "certainty", "score": "entropy", "temperature": 1.0, "calibrate": False}
    assert route_spec(**args).name(["a", "b"]) == "a+b.certainty-entropy"
    no_mc = {**args, "score": "logit_entropy", "temperature": 2.0, "calibrate": True}
    assert route_spec(**no_mc).name(["a", "b"]) == "a+b.certainty-logit_entropy-T2-calibrated"
    # a score or temperature that the router does not read is not part of the route
    assert route_spec(**{**no_mc, "router": "learned", "calibrate": False}).name(["a", "b"]) == "a+b.learned"
    assert torch.is_tensor(certainty_scores("energy", logits=np.zeros((1, 2), np.float32)))


def test_two_teachers_certainty_routes_wrongly_and_the_learned_router_correctly():
    """The case of docs/routing.md, "Why it matters": teacher 0 (classes a, b) is confident on every row, teacher 1
    (classes c, d) hesitant on every row, so certainty always picks teacher 0; the teachers' features tell the
    owners apart, and the learned router, fitted on labelled validation rows, routes by them."""
    labels = ["a", "b", "c", "d"]
    gold = np.repeat([0, 1, 2, 3], 15)
    owners = np.array([0, 0, 1, 1])[gold]
    confident = np.array([[4.0, 0.0]] * 60, np.float32)  # teacher 0: (0.98, 0.02) on every row
    hesitant = np.array([[0.2, 0.0]] * 60, np.float32)  # teacher 1: (0.55, 0.45) on every row
    scores = np.stack([certainty_scores("logit_max_prob", logits=z).numpy() for z in (confident, hesitant)], 1)
    certainty = routing_accuracy(scores, owners, gold, labels)
    assert certainty["per_class"] == {"a": 1.0, "b": 1.0, "c": 0.0, "d": 0.0}  # every row goes to teacher 0
    # pooled features: the owner shifts the first coordinate by ±2, plus unit noise
    rng = np.random.default_rng(0)
    features = rng.normal(size=(60, 4)) + np.where(owners == 0, -2.0, 2.0)[:, None] * np.eye(4)[0]
    _, crossfit, _ = learned_router(features, owners, features, 2, folds=4, seed=0)
    learned = routing_accuracy(crossfit, owners, gold, labels)
    assert learned["accuracy"] >= 0.95 > certainty["accuracy"] == 0.5


def _two_class_logits(max_prob: list[float]) -> np.ndarray:
    """Logits of a two-class teacher whose max softmax is ``max_prob`` on each row: z = (log p/(1 − p), 0)."""
    p = np.asarray(max_prob, np.float64)
    return np.stack([np.log(p / (1 - p)), np.zeros_like(p)], -1).astype(np.float32)


def test_certainty_as_ood_detection_by_hand():
    """Six rows, the first three of the teacher's own classes (negatives), the last three of another teacher's
    (positives). AUROC = the share of (other, own) pairs whose oriented score is larger on the other row, a tie
    counting half (Mann-Whitney), over 3 × 3 = 9 pairs."""
    own = np.array([True, True, True, False, False, False])
    table = pd.DataFrame(
        {
            "entropy": [0.1, 0.2, 0.3, 0.7, 0.8, 0.9],  # every other row above every own row: 9/9
            "certainty": [0.9, 0.8, 0.7, 0.3, 0.2, 0.1],  # negated: −0.3 > −0.7 ...: 9/9
            "max_prob": [0.6] * 6,  # all 9 pairs tie: 4.5/9
            "variance": [0.05, 0.06, 0.07, 0.01, 0.02, 0.03],  # every other row below every own row: 0/9
            # own 0.1, 0.4, 0.6; other 0.4 (> 0.1, ties 0.4: 1.5), 0.5 (> 0.1, 0.4: 2), 0.7 (> all: 3): 6.5/9
            "mutual_info": [0.1, 0.4, 0.6, 0.4, 0.5, 0.7],
            # own 0.2, 0.5, 0.5; other 0.3 (> 0.2: 1), 0.6 (> all: 3), 0.6 (3): 7/9
            "mean_entropy": [0.2, 0.5, 0.5, 0.3, 0.6, 0.6],
        }
    )
    # max softmax own 0.9, 0.6, 0.8; other 0.7, 0.55, 0.95, negated: an other row counts where its max softmax is
    # below the own row's: 0.7 (< 0.9, 0.8: 2), 0.55 (< all three: 3), 0.95 (none: 0): 5/9
    logits = _two_class_logits([0.9, 0.6, 0.8, 0.7, 0.55, 0.95])
    record = teacher_ood(own, logits, table)
    assert record["n_own"] == 3 and record["n_other"] == 3 and record["mc"] is True
    assert record["auroc"] == pytest.approx(
        {
            "entropy": 1.0,
            "certainty": 1.0,
            "max_prob": 0.5,
            "variance": 0.0,
            "mean_entropy": 7 / 9,
            "mutual_info": 6.5 / 9,
            "logit_max_prob": 5 / 9,
        }
    )
    # without the MC-dropout table only the logit score is measured
    bare = teacher_ood(own, logits, None)
    assert bare["mc"] is False and bare["auroc"]["logit_max_prob"] == pytest.approx(5 / 9)
    assert all(bare["auroc"][score] is None for score in OOD_MC_SCORES)


def test_certainty_as_ood_detection_on_every_split_and_none_without_rows_on_one_side():
    """ood_auroc measures every teacher on train and validation; an MC score only where the route reads the MC
    signal (train here); a teacher with no row of its classes on a split gets None for every score."""
    gold = {"train": np.array([0, 0, 1, 1]), "validation": np.array([0, 0, 0, 0])}  # teacher tb owns class 1
    blocks = {"ta": np.array([0]), "tb": np.array([1])}
    table = pd.DataFrame({"entropy": [0.1, 0.2, 0.8, 0.9]})  # ta: its own rows the most certain
    table = table.assign(certainty=0.5, max_prob=0.5, variance=0.1, mean_entropy=0.5, mutual_info=0.3)  # (all equal)
    inputs = SimpleNamespace(
        teachers=["ta", "tb"],
        logits={(t, s): _two_class_logits([0.9] * 4) for t in blocks for s in gold},
        mc={("ta", "train"): (None, table), ("tb", "train"): (None, table)},
        own_rows=lambda t, s: np.isin(gold[s], blocks[t]),
    )
    record = ood_auroc(inputs)
    assert list(record) == ["train", "validation"] and list(record["train"]) == ["ta", "tb"]
    assert record["train"]["ta"]["auroc"]["entropy"] == 1.0
    assert record["train"]["tb"]["auroc"]["entropy"] == 0.0  # the same entropies: tb's own rows the least certain
    assert record["train"]["ta"]["auroc"]["logit_max_prob"] == 0.5  # the same max softmax on every row
    assert record["validation"]["ta"]["mc"] is False and record["validation"]["ta"]["auroc"]["entropy"] is None
    assert record["validation"]["ta"]["auroc"]["logit_max_prob"] is None  # ta owns every validation row
    assert (record["validation"]["tb"]["n_own"], record["validation"]["tb"]["n_other"]) == (0, 4)
    assert set(record["validation"]["tb"]["auroc"].values()) == {None}


@pytest.mark.parametrize("mc_splits", [[], ["train"]])
def test_route_json_records_certainty_as_ood_detection(tmp_path, monkeypatch, mc_splits):
    """The route job writes ood_auroc into route.json: the MC scores null on a split whose MC-dropout signal the
    route does not read (every split for a route without it, as muki_no_mc's with mc_dropout.splits: []), the
    logit score measured on both."""
    from kdpipe.routing import inputs as module
    from kdpipe.routing.build import build_route

    labels, classes = ["a", "b", "c"], {"ta": ["a", "b"], "tb": ["c"]}
    gold = np.tile([0, 1, 2], 8)
    frame = pd.DataFrame({"row_id": np.arange(len(gold)), "label_id": gold})
    monkeypatch.setattr(module, "read_labels", lambda data: labels)
    monkeypatch.setattr(module, "read_split", lambda data, split: frame)
    rng = np.random.default_rng(0)
    # ta is sure on its own rows (max softmax 0.95) and unsure on tb's (0.55): logit_max_prob AUROC 1.0
    ta_logits = _two_class_logits(np.where(np.isin(gold, [0, 1]), 0.95, 0.55))
    entropy = np.where(np.isin(gold, [0, 1]), 0.8, 0.2)  # ta's MC entropy: more certain on tb's rows: AUROC 0.0

    def read_logits(path, row_ids, *args):
        teacher = Path(path).relative_to(tmp_path).parts[0]
        return (ta_logits if teacher == "ta" else np.zeros((len(row_ids), 1), np.float32)), classes[teacher]

    def read_mc(path, row_ids, labels):  # every column an MC pass writes; those not set here the same on every row
        table = pd.DataFrame({"row_id": row_ids, "entropy": entropy, "certainty": 1 - entropy, "max_prob": 0.7})
        table = table.assign(variance=0.1, mean_entropy=0.5, mutual_info=0.3)
        return np.full((len(row_ids), len(labels)), 1 / len(labels)), table

    monkeypatch.setattr(module, "read_logits", read_logits)
    monkeypatch.setattr(module, "read_pooled", lambda path, row_ids: (rng.normal(size=(len(row_ids), 4)), None))
    monkeypatch.setattr(module, "read_mc", read_mc)
    spec = RouteSpec("certainty", "logit_entropy", 1.0)
    params = {
        **spec.to_dict(),
        "teachers": ["ta", "tb"],
        "routing": {"neighbours": 2, "folds": 2, "seed": 0},
        "signals": spec.signals(mc_splits=mc_splits),
    }
    build_route(RouteSettings.from_params(params), tmp_path / "data", tmp_path, tmp_path / "route")
    record = json.loads((tmp_path / "route/route.json").read_text())["ood_auroc"]
    for split in ("train", "validation"):
        ta = record[split]["ta"]
        assert (ta["n_own"], ta["n_other"]) == (16, 8) and ta["auroc"]["logit_max_prob"] == 1.0
        assert ta["mc"] is (split in mc_splits)
        assert ta["auroc"]["entropy"] == (0.0 if split in mc_splits else None)
        assert ta["auroc"]["certainty"] == (0.0 if split in mc_splits else None)
        assert ta["auroc"]["max_prob"] == (0.5 if split in mc_splits else None)  # the same on every row
        assert ta["auroc"]["variance"] == (0.5 if split in mc_splits else None)
        # tb, a teacher of one class, is equally sure of every row
        assert record[split]["tb"]["auroc"]["logit_max_prob"] == 0.5


def test_the_route_job_says_the_routing_warning_as_soon_as_it_routes(tmp_path, monkeypatch, capfd):
    """The route job warns in its own output (the rule sends it to its log and to Snakemake's console), with the
    better router's method_args, at the threshold the command line gives (routing.warn_below, outside the slice);
    the report repeats it from route.json."""
    from kdpipe.cli import main
    from kdpipe.report.routing import read_routes
    from kdpipe.routing import inputs as module

    labels, classes = ["a", "b", "c", "d"], {"ta": ["a", "b"], "tb": ["c", "d"]}
    gold = np.tile([0, 1, 2, 3], 10)
    owner = np.isin(gold, [2, 3]).astype(float)
    frame = pd.DataFrame({"row_id": np.arange(len(gold)), "label_id": gold})
    monkeypatch.setattr(module, "read_labels", lambda data: labels)
    monkeypatch.setattr(module, "read_split", lambda data, split: frame)
    confident, hesitant = _two_class_logits([0.98] * len(gold)), _two_class_logits([0.55] * len(gold))

    def read_logits(path, row_ids, *args):  # ta is sure of every row, tb of none: certainty sends all to ta
        teacher = Path(path).relative_to(tmp_path).parts[0]
        return (confident if teacher == "ta" else hesitant), classes[teacher]

    features = np.random.default_rng(0).normal(size=(len(gold), 4)) + 3 * owner[:, None] * np.eye(4)[0]
    monkeypatch.setattr(module, "read_logits", read_logits)
    monkeypatch.setattr(module, "read_pooled", lambda path, row_ids: (features, None))
    spec = RouteSpec("certainty", "logit_max_prob", 1.0)
    params = {**spec.to_dict(), "teachers": ["ta", "tb"], "routing": {"neighbours": 2, "folds": 2, "seed": 0}}
    params["signals"] = spec.signals(mc_splits=[])

    def route(*threshold):
        args = ["route", "--params", json.dumps(params), "--data", str(tmp_path / "data")]
        args += ["--signals-root", str(tmp_path), "--out", str(tmp_path / "route"), *threshold]
        assert main(args) == 0
        return capfd.readouterr().err

    said = route("--warn-below", "0.8")
    assert "[kdpipe] routing warning: router certainty/logit_max_prob sends 50% of validation rows" in said
    assert "(below routing.warn_below = 80%)" in said and "method_args: {router: learned}" in said
    assert "routing warning" in route()  # 0.8 without the option, as the report's default
    assert "routing warning" not in route("--warn-below", "0.4")
    # the report says it again from what the route recorded, at its own threshold
    (reported,) = read_routes([tmp_path / "route/route.json"], 0.8)
    assert reported["warning"] in said
    # and so does every student that reads the route, before it trains, also when the route job did not run here (a
    # route linked from the shared cache): the same line, at the threshold of its own --warn-below
    from kdpipe.stages import distill

    line = next(line for line in said.splitlines() if line.startswith("[kdpipe] routing warning: "))

    def student_data(*args, **kwargs):
        raise RuntimeError("training starts")

    monkeypatch.setattr(distill, "student_data", student_data)
    for threshold, warned in (("0.8", True), (None, True), ("0.4", False)):
        with pytest.raises(RuntimeError, match="training starts"):
            distill.run(student_settings({"method": "muki"}), tmp_path / "data", tmp_path, tmp_path / "s",
                        route=tmp_path / "route", warn_below=threshold)  # fmt: skip
        assert capfd.readouterr().err.splitlines() == ([line] if warned else [])
    from kdpipe.cli import parser

    parsed = parser().parse_args(["distill", "--data", "d", "--signals-root", "s", "--out", "o", "--warn-below", "0.8"])
    assert parsed.warn_below == "0.8"
