"""The plan: config slices per rule, seed expansion, and config errors caught before any job runs."""


import pytest
import yaml

from kdpipe.plan import Plan
from kdpipe.store import KdpipeError
from tests.conftest import REPO

SCHEMA = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())


def load(path="tests/configs/tiny.yaml", edit=None):
    from snakemake.utils import validate
    config = yaml.safe_load((REPO / path).read_text())
    if edit:
        edit(config)
    validate(config, str(REPO / "workflow/schemas/config.schema.yaml"), set_default=True)
    return Plan(config, SCHEMA)


def test_slices_hold_only_what_the_output_depends_on():
    plan = load()
    teacher = plan.teacher_params("ta")
    assert teacher["epochs"] == 1 and teacher["classes"] == {"slice": 0, "of": 2}
    assert teacher["backbone"] == "builtin:tiny-bert"                      # from teacher_defaults
    student = plan.student_params("s_vkd")
    assert student["lr"] == 1e-3 and student["teachers"] == ["ta", "tb"]
    assert "s_vkd_ce" not in str(student)
    assert "splits" not in plan.mc_params("train")          # which splits run is not part of each job's identity
    assert plan.mc_params("train")["split"] == "train"


def test_default_config_is_valid():
    plan = load("config.yaml")
    assert set(plan.teachers) == {"minilm_a", "minilm_b"} and "vkd" in plan.students


def test_seeds_expand_into_student_jobs_without_touching_teachers():
    def edit(c):
        c["students"]["s_vkd"]["seeds"] = [1, 2, 3]
    plan = load(edit=edit)
    assert [s for s in plan.students if s.startswith("s_vkd.")] == ["s_vkd.seed1", "s_vkd.seed2", "s_vkd.seed3"]
    assert plan.student_params("s_vkd.seed2")["seed"] == 2
    assert plan.eval_params("s_vkd.seed2", "test")["base"] == "s_vkd"


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["students"]["s_vkd"].update(teachers=["ta", "tz"]), r"students\.s_vkd\.teachers: unknown teacher 'tz'"),
    (lambda c: c["students"]["s_vkd"].update(method="nope"), r"unknown method 'nope'"),
    (lambda c: c["teachers"]["ta"].update(epoch=3), r"teachers\.ta: Additional properties .*'epoch'"),
    (lambda c: c["students"].update(ta={"lr": 1e-3}), r"'ta' names both a teacher and a student"),
    (lambda c: (c["teachers"]["ta"].update(classes=["business", "sport"]),
                c["teachers"]["tb"].update(classes=["sport", "tech"])),
     r"teachers 'ta' and 'tb' both cover class 'sport'.*disjoint or identical"),
])
def test_config_errors_name_the_key(edit, message):
    with pytest.raises(KdpipeError, match=message):
        load(edit=edit)
