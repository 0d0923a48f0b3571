"""End to end, unlabelled transfer rows (docs/your-own-models-and-data.md, "Unlabelled transfer data"): half of the
tiny dataset's training labels withheld and a local file of extra text; the students learn from both, the report
says so, and editing the transfer file in place reruns only what reads transfer rows (read from the dry run's
job list): no teacher, no signal on train, no student without transfer rows."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kdpipe.signals.catalog import SIGNALS as SIGNAL_CATALOG
from tests.test_workflow import finished_project, planned_jobs

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/transfer.yaml"


def write_project_files(project: Path) -> None:
    texts = [f"an unlabelled dispatch about markets, film and politics number {i}" for i in range(24)]
    (project / "data").mkdir(exist_ok=True)
    pd.DataFrame({"text": texts + [""]}).to_csv(project / "data/extra.csv", index=False)
    config = yaml.safe_load((project / "tests/configs/tiny.yaml").read_text())
    config["dataset"]["split"]["unlabelled"] = 0.5
    config["dataset"]["transfer"] = "data/extra.csv"
    # MUKI routed by the teachers' logits: no MC-dropout pass, so the run stays short
    config["students"] = {name: config["students"][name] for name in ("s_none", "s_vkd", "s_muki_no_mc")}
    config["mc_dropout"]["splits"] = []
    config["evaluate"] = {"splits": ["test"]}
    (project / CONFIG).write_text(yaml.safe_dump(config))


@pytest.fixture(scope="module")
def transferred(tmp_path_factory):
    return finished_project(tmp_path_factory, "transfer", configfile=CONFIG, setup=write_project_files)


def test_students_learn_from_transfer_rows_and_the_report_says_how_many(transferred):
    project, _, _ = transferred
    transfer = json.loads((project / "results/transfer/tiny_bbc/manifest.json").read_text())
    withheld = json.loads((project / "results/data/tiny_bbc/manifest.json").read_text())["unlabelled_rows"]
    assert transfer["rows"]["transfer"] == withheld + 24 and transfer["dropped"]["empty"] == 1
    for student, rows in (("s_vkd", withheld + 24), ("s_muki_no_mc", withheld + 24), ("s_none", 0)):
        manifest = json.loads((project / f"results/students/{student}/manifest.json").read_text())
        assert manifest["rows"].get("transfer", 0) == rows, student
        evaluation = json.loads((project / f"results/eval/{student}/test.json").read_text())
        assert evaluation["transfer_rows"] == rows
    assert list((project / "results/routes").glob("*/transfer.json"))
    summary = pd.read_csv(project / "results/report/summary.tsv", sep="\t").set_index("model")
    assert f"+ {withheld + 24:,} transfer rows without labels" in summary.loc["s_vkd", "gold_labels"]
    assert "transfer" not in summary.loc["s_none", "gold_labels"]
    assert (project / "results/report/transfer.png").stat().st_size > 10_000


def test_an_edited_transfer_file_reruns_only_what_reads_transfer_rows(transferred):
    project, env, _ = transferred
    assert planned_jobs(project, env, configfile=CONFIG) == set()
    with open(project / "data/extra.csv", "a") as handle:
        handle.write("one more unlabelled dispatch\n")
    jobs = planned_jobs(project, env, configfile=CONFIG)
    rules = {rule for rule, _ in jobs}
    assert {"transfer", "route_transfer", "distill", "evaluate", "report"} <= rules
    assert not rules & {"prepare", "finetune_teacher", "route"}
    # every job of a signal pass (named after its signals at S = 1) is on the transfer rows
    signal_jobs = [w for rule, w in jobs if rule == "signal_shard" or set(rule.split("+")) <= set(SIGNAL_CATALOG)]
    assert signal_jobs and all("split=transfer" in wildcards for wildcards in signal_jobs)
    students = {wildcards for rule, wildcards in jobs if rule == "distill"}
    assert students == {"student=s_vkd", "student=s_muki_no_mc"}
