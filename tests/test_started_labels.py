"""The gold labels a student depends on before its own training reads any (kdpipe/methods/started_labels.py,
docs/report.md, "Which gold labels each model read"): a route's labels told from those that chose the kept epoch,
the model a student starts from, and how the tables say it."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import BertConfig, BertModel

from kdpipe.core.store import write_json
from kdpipe.methods.started_labels import OUTSIDE, start_label_use, started_label_use
from kdpipe.models.loading import TINY_BERT
from kdpipe.report.summary import describe_label_use
from kdpipe.training.loop import FitResult, label_use
from tests.test_checkpoint_teachers import make_checkpoint

PLAIN = SimpleNamespace(signals=["logits"], prototypes=False)  # a method without Meta-KD's example weights


def test_a_routers_labels_are_told_from_those_that_chose_the_kept_epoch():
    route = {"gold_labels": {"validation": 80}}  # a knn, learned or calibrated route
    started = started_label_use({}, PLAIN, 400, route, None)
    assert started == {"router: validation": 80}
    kept = FitResult({}, {}, 0, validated=True)  # its kept epoch chosen on the validation labels too
    record = label_use({"rows": {"train": 400, "validation": 80}, "gold_labels": started}, kept)
    assert record == {"validation": 80, "router: validation": 80}
    assert describe_label_use(record) == "validation 80 · router: validation 80"
    oracle = started_label_use({}, PLAIN, 400, {"gold_labels": {"train": 400, "validation": 80}}, None)
    assert describe_label_use({**oracle, "train": 400}) == "train 400 · router: train 400 · router: validation 80"
    assert started_label_use({}, PLAIN, 400, {"gold_labels": {}}, None) == {}  # a certainty score reads none


def test_a_student_started_from_a_classifier_fine_tuned_elsewhere_is_marked(tmp_path):
    make_checkpoint(tmp_path / "clf", ["sport", "tech"])
    torch.manual_seed(0)
    BertModel(BertConfig(**TINY_BERT)).save_pretrained(tmp_path / "encoder")  # pre-trained only: no gold labels
    kdpipe_folder = tmp_path / "student"
    kdpipe_folder.mkdir()
    write_json(kdpipe_folder / "manifest.json", {"gold_labels": {"validation": 8}})

    def started(source):
        return started_label_use(source, PLAIN, 40, None, None)

    assert started(str(tmp_path / "clf")) == OUTSIDE
    assert describe_label_use(started(str(tmp_path / "clf"))) == "checkpoint: trained outside kdpipe"
    assert started(str(tmp_path / "encoder")) == {}
    assert started("builtin:tiny-bert") == {}
    assert started(str(kdpipe_folder)) == {"validation": 8}  # a kdpipe model says what it read
    assert start_label_use(str(tmp_path / "clf")) == OUTSIDE  # (ProKT's backbone goes the same way)
