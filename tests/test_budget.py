"""The disk budget of the feature dumps, checked by the plan before any job
(docs/design.md, "Feature dumps and their size"): bounds by hand, the one message, dumps already made, the default
budget (free space), the split sizes, and students with ``signals: online``, which need no dump."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kdpipe.core.store import DISK_RESERVE, KdpipeError
from kdpipe.models.backbones import hidden_size
from kdpipe.plan import budget
from kdpipe.plan.budget import DumpBound, split_rows
from tests.conftest import REPO
from tests.test_plan import load

# tests/configs/tiny.yaml: 5 classes x 12 rows (max_per_class), 20% validation and 20% test -> 36 train rows; its DFA
# student (1 layer) aligns with hidden state 2 of each 2-layer tiny-bert teacher (H = 32) at max_length 32
TRAIN_ROWS, ONE_DUMP = 36, 36 * 32 * 1 * 32 * 2  # 73,728 bytes per teacher


def max_gb(value):
    def edit(config):
        config.setdefault("dump", {})["max_gb"] = value

    return edit


def check(edit=None):
    """What the workflow does when it builds the DAG (workflow/rules/common.smk): the plan, then its disk budget."""
    plan = load(edit=edit)
    plan.check_dump_budget()
    return plan


@pytest.fixture
def in_tmp(tmp_path, monkeypatch) -> Path:
    """The workflow directory: an empty one (no results yet)."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_bounds_by_hand(in_tmp):
    plan = load()
    assert split_rows(plan, "train") == TRAIN_ROWS and split_rows(plan, "test") == 12
    assert list(plan.planned_dumps()) == [("hidden", "ta", "train"), ("hidden", "tb", "train")]
    assert plan.planned_dumps()[("hidden", "ta", "train")] == ["s_dfa"]
    bound = plan.dump_bound("hidden", "ta", "train")
    assert bound == DumpBound("hidden", "ta", "train", rows=36, max_length=32, layers=1, width=32)
    assert bound.bytes == ONE_DUMP
    attentions = DumpBound("attentions", "t", "train", rows=10, max_length=16, layers=2, width=12)
    assert attentions.bytes == 10 * 2 * 12 * 16**2 * 2  # rows x layers x heads x max_length² x 2 bytes
    assert DumpBound("attentions_mean", "t", "train", 10, 16, 2, 1).bytes == 10 * 2 * 16**2 * 2


def test_what_would_fit_by_hand():
    hidden = DumpBound("hidden", "t.seed1", "train", rows=100, max_length=64, layers=4, width=10)  # 512,000 bytes
    assert hidden.fitting(hidden.bytes // 2) == [
        "2 layers instead of 4 (students with fewer layers align with fewer; DFA: method_args.align_number)",
        "max_length 32 instead of 64 (teachers.t.max_length, and the same for the students that read it)",
    ]
    assert hidden.fitting(hidden.bytes / 64) == []  # under one layer, under max_length 8
    transfer = DumpBound("hidden", "t", "transfer", rows=1000, max_length=64, layers=1, width=10)
    assert transfer.fitting(transfer.bytes * 0.4)[-1] == "dataset.transfer_max_rows: 400 (of 1,000 transfer rows)"
    attentions = DumpBound("attentions", "t", "train", rows=10, max_length=64, layers=1, width=16)
    fixes = attentions.fitting(attentions.bytes / 16)  # a sixteenth: a quarter of the length, or the mean of heads
    assert fixes[0].startswith("max_length 16 instead of 64") and "attention_heads: mean" in fixes[1]


def test_a_budget_too_small_stops_the_plan_with_one_message(in_tmp):
    check(max_gb(2 * ONE_DUMP / 1e9))  # exactly enough
    with pytest.raises(KdpipeError) as err:
        check(max_gb(1e-4))  # 100,000 bytes: room for one dump and 26,272 bytes of the other
    message = str(err.value)
    assert message.startswith("dump.max_gb: the feature dumps of this config take up to 0.147 MB (2 dumps)")
    assert "dump.max_gb allows 0.1 MB" in message
    assert "hidden of teacher 'ta' on split 'train' (read by s_dfa), takes up to 0.0737 MB" in message
    assert "(36 rows x 32 tokens (max_length) x 1 layer x 32 hidden units x 2 bytes)" in message
    # 26,272 / 73,728 of 32 tokens: max_length 11; not even one layer fits at 32
    assert message.endswith(
        "it would fit with max_length 11 instead of 32 (teachers.ta.max_length, and the same for the students that "
        "read it); or it needs no room with signals: online on s_dfa (the students run the teacher in their own jobs; "
        "no dump)"
    )
    with pytest.raises(KdpipeError, match=r"the other dumps alone take 0\.0737 MB; raise the budget"):
        check(max_gb(5e-5))


def test_the_default_budget_is_the_free_space_less_a_reserve(in_tmp, monkeypatch):
    """Both dumps, the largest's shard parts beside it, and the reserve (64 MB at least) must fit."""
    need = 2 * ONE_DUMP + ONE_DUMP + DISK_RESERVE
    for free, fits in ((need, True), (need - 1, False)):
        usage = type("Usage", (), {"free": free})()
        monkeypatch.setattr(budget.shutil, "disk_usage", lambda path, usage=usage: usage)
        if fits:
            check()
            continue
        with pytest.raises(KdpipeError, match=r"are free at .*kept in reserve.* dump\.max_gb sets another budget"):
            check()


def test_a_dump_already_made_with_the_same_settings_needs_no_room(in_tmp):
    plan = load()
    folder = in_tmp / "results/signals/ta/train"
    folder.mkdir(parents=True)
    rows = split_rows(plan, "train")
    manifest = {"config": plan.signal_params("ta", "train", "hidden"), "layout": "packed", "rows": rows}
    (folder / "hidden.json").write_text(json.dumps(manifest))
    check(max_gb(ONE_DUMP / 1e9))  # only tb's is to be made
    (folder / "hidden.json").write_text(json.dumps({**manifest, "layout": None}))  # an older layout: remade
    with pytest.raises(KdpipeError, match=r"\(2 dumps\)"):
        check(max_gb(ONE_DUMP / 1e9))
    # the same settings on other data (the split grew since): remade, so it needs room again
    (folder / "hidden.json").write_text(json.dumps({**manifest, "rows": rows - 1}))
    with pytest.raises(KdpipeError, match=r"\(2 dumps\)"):
        check(max_gb(ONE_DUMP / 1e9))


def test_the_budget_is_part_of_no_jobs_identity(in_tmp):
    hidden = load().signal_params("ta", "train", "hidden")
    assert load(edit=max_gb(100)).signal_params("ta", "train", "hidden") == hidden
    assert "max_gb" not in load(edit=max_gb(100)).signal_params("ta", "train", "logits")


def test_split_sizes_come_from_the_prepared_data_when_it_was_made_from_this_config(in_tmp, monkeypatch):
    from kdpipe.data.prepare import prepare
    from kdpipe.data.settings import DatasetSettings

    plan = load()
    prepare(DatasetSettings.from_params(plan.prepare_params()), in_tmp / "results/data/tiny_bbc")

    def no_second_read(params):
        raise AssertionError("the source was read again")

    monkeypatch.setattr("kdpipe.data.prepare._selected", no_second_read)
    again = load()
    assert split_rows(again, "train") == TRAIN_ROWS and split_rows(again, "validation") == 12


def test_hidden_sizes_of_builtins_and_local_folders(tmp_path):
    assert hidden_size("builtin:minilm-l6") == 384 and hidden_size("builtin:tiny-bert") == 32
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "distilbert", "dim": 48, "n_layers": 2}))
    assert hidden_size(str(tmp_path)) == 48
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "odd"}))
    with pytest.raises(KdpipeError, match="cannot tell how many hidden units"):
        hidden_size(str(tmp_path))


def test_the_budget_keeps_the_plan_torch_free(in_tmp):
    code = (
        "import sys, yaml; from snakemake.utils import validate; from kdpipe.plan import Plan; "
        f"c = yaml.safe_load(open('{REPO}/tests/configs/tiny.yaml')); "
        f"validate(c, '{REPO}/kdpipe/config.schema.yaml', set_default=True); Plan(c).check_dump_budget(); "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=in_tmp, env=env)
    assert out.stdout.strip() == "[]"


def online(student="s_dfa"):
    def edit(config):
        config["students"][student]["signals"] = "online"

    return edit


def test_an_online_student_needs_no_dump_and_takes_its_teachers_as_inputs(in_tmp):
    cached, plan = load(), check(lambda c: (max_gb(1e-9)(c), online()(c)))  # no dump: any budget fits
    assert [f for f in cached.signal_files("s_dfa") if "hidden" in f] and not plan.planned_dumps()
    assert plan.signal_files("s_dfa") == [f for f in cached.signal_files("s_dfa") if "hidden" not in f]  # logits
    assert plan.online_teacher_dirs("s_dfa") == ["results/teachers/ta", "results/teachers/tb"]
    assert cached.online_teacher_dirs("s_dfa") == [] and plan.online_teacher_dirs("s_vkd") == []
    assert plan.student_params("s_dfa")["signals"] == "online" and "signals" not in cached.student_params("s_dfa")
    assert "kdpipe.signals.online" in plan.student_modules("s_dfa")
    assert "kdpipe.signals.online" not in cached.student_modules("s_dfa")
    assert plan.feature_layers("ta") == [] and cached.feature_layers("ta") == [2]  # no dump keeps its layers


def test_online_is_refused_where_a_method_reads_no_token_level_signal(in_tmp):
    with pytest.raises(KdpipeError, match=r"students\.s_vkd\.signals: online .* method 'vanilla_kd' reads none"):
        load(edit=online("s_vkd"))


def test_the_message_names_students_as_the_config_does(in_tmp):
    """Seeds and Meta-KD's first stage are jobs of their own; the message names the config's entry once."""

    def edit(config):
        max_gb(1e-4)(config)
        config["students"]["s_dfa"]["seeds"] = [0, 1]

    plan = load(edit=edit)
    assert len(plan.planned_dumps()[("hidden", "ta", "train")]) == 2  # (both seeds' jobs read the dump)
    with pytest.raises(KdpipeError) as err:
        plan.check_dump_budget()
    assert "(read by s_dfa)," in str(err.value) and "signals: online on s_dfa (" in str(err.value)
