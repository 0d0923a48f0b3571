"""The plan: config slices per rule, seed expansion, and config errors caught before any job runs."""

import pytest
import yaml

from kdpipe.core.store import KdpipeError
from kdpipe.plan import Plan
from kdpipe.plan.numbers import check_numbers
from tests.conftest import REPO

SCHEMA = yaml.safe_load((REPO / "kdpipe/config.schema.yaml").read_text())


def load(path="tests/configs/tiny.yaml", edit=None):
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / path).read_text())
    if edit:
        edit(config)
    validate(config, str(REPO / "kdpipe/config.schema.yaml"), set_default=True)
    return Plan(config, SCHEMA)


def test_slices_hold_only_what_the_output_depends_on():
    plan = load()
    teacher = plan.teacher_params("ta")
    assert teacher["epochs"] == 1 and teacher["classes"] == {"slice": 0, "of": 2}
    assert teacher["backbone"] == "builtin:tiny-bert"  # from teacher_defaults
    student = plan.student_params("s_vkd")
    assert student["lr"] == 1e-3 and student["teachers"] == ["ta", "tb"]
    assert "s_vkd_ce" not in str(student)
    mc = plan.signal_params("ta", "train", "mc")
    assert "splits" not in mc and "shards" not in mc  # which splits run, and how, is not part of a job's identity
    assert mc["split"] == "train" and mc["signal"] == "mc"


def test_devices_choose_how_a_job_runs_not_what_it_makes():
    def two_devices(config):
        config["teachers"]["ta"]["devices"] = 2
        config["students"]["s_vkd"]["devices"] = 3

    plain, spread = load(), load(edit=two_devices)
    assert (spread.devices("ta"), spread.devices("tb"), spread.devices("s_vkd")) == (2, 1, 3)
    assert "devices" not in str(spread.teacher_params("ta")) and "devices" not in str(spread.student_params("s_vkd"))
    assert spread.teacher_params("ta") == plain.teacher_params("ta")  # nothing reruns when devices change
    assert spread.student_params("s_vkd") == plain.student_params("s_vkd")


def test_head_init_is_in_a_slice_only_where_it_changes_the_model():
    # the schema fills head_init: copy into student_defaults.model; a student's slice must not change with it
    plan = load("tests/configs/tiny_full.yaml")
    assert "head_init" not in str(plan.student_params("s_vkd")["model"])
    assert "head_init" not in str(plan.student_params("s_hydra")["model"])

    def noisy_heads(config):
        config["students"]["s_hydra"]["model"]["head_init"] = "noise"

    model = load("tests/configs/tiny_full.yaml", edit=noisy_heads).student_params("s_hydra")["model"]
    assert model["head_init"] == "noise" and model["head_noise"] == 0.01


def test_default_config_is_valid():
    plan = load("config.yaml")
    assert set(plan.teachers) == {"minilm_a", "minilm_b"} and "vkd" in plan.students


def test_the_uncertainty_split_is_planned_only_with_members_or_heads():
    assert not load().has_members()  # subset teachers and single-head students: epistemic would be exactly 0
    assert load("tests/configs/tiny_full.yaml").has_members()  # an ensemble and multi-head students

    def one_head_only(config):
        config["students"] = {"s": {"method": "vanilla_kd", "teachers": ["t"]}}
        config["teachers"] = {"t": {}}

    assert not load("tests/configs/tiny_full.yaml", edit=one_head_only).has_members()


def test_the_no_teacher_baseline_reads_no_teacher():
    plan = load()
    assert plan.student_teachers("s_none") == [] and plan.signal_files("s_none") == []
    assert plan.student_params("s_none")["teachers"] == []


def test_seeds_expand_into_student_jobs_without_touching_teachers():
    def edit(c):
        c["students"]["s_vkd"]["seeds"] = [1, 2, 3]

    plan = load(edit=edit)
    assert [s for s in plan.students if s.startswith("s_vkd.")] == ["s_vkd.seed1", "s_vkd.seed2", "s_vkd.seed3"]
    assert plan.student_params("s_vkd.seed2")["seed"] == 2
    assert plan.eval_params("s_vkd.seed2")["base"] == "s_vkd"


def test_one_evaluation_slice_per_model_covers_its_splits():
    """One evaluate job per model: its slice names every split it is evaluated on, so adding one reruns it."""
    plan = load(edit=lambda c: c["evaluate"].update(splits=["validation", "test"]))
    assert plan.eval_params("ta")["splits"] == ["validation", "test"] and "split" not in plan.eval_params("ta")
    assert plan.eval_params("oracle")["splits"] == ["validation", "test"]
    assert plan.eval_params("ta", ["train"])["splits"] == ["train"]  # (benchmarks/scaling.py evaluates on train)


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            lambda c: c["students"]["s_vkd"].update(teachers=["ta", "tz"]),
            r"students\.s_vkd\.teachers: unknown teacher 'tz'",
        ),
        (lambda c: c["students"]["s_vkd"].update(method="nope"), r"unknown method 'nope'"),
        (lambda c: c["evaluate"].update(oracle=["ta", "tz"]), r"evaluate\.oracle: unknown teacher 'tz'"),
        (
            lambda c: c["evaluate"].update(oracle=["ta"]),
            r"evaluate\.oracle: label '(politics|sport|tech)' in the data is covered by no teacher",
        ),
        (
            lambda c: c["students"]["s_none"].update(teachers=["ta"]),
            r"students\.s_none\.teachers: method 'supervised' learns from the gold labels alone; remove `teachers`",
        ),
        (lambda c: c["teachers"]["ta"].update(epoch=3), r"teachers\.ta: Additional properties .*'epoch'"),
        (lambda c: c["students"].update(ta={"lr": 1e-3}), r"'ta' names both a teacher and a student"),
        # method_args are declared per method in the registry and checked before any job runs
        (
            lambda c: c["students"]["s_vkd"].update(method_args={"temprature": 1}),
            r"students\.s_vkd\.method_args: unknown key 'temprature' \(did you mean 'temperature'\?\); "
            r"this method knows temperature, hard_label_weight",
        ),
        (
            lambda c: c["students"]["s_uhc"].update(method_args={"temperature": "hot"}),
            r"students\.s_uhc\.method_args\.temperature: expected float, got 'hot'",
        ),
        (
            lambda c: c["students"]["s_muki"].update(method_args={"aggregation": "max"}),
            r"students\.s_muki\.method_args\.aggregation: 'max'; choose one of hard, soft",
        ),
        (
            lambda c: c["students"]["s_dfa"].update(method_args={"margin": True}),
            r"students\.s_dfa\.method_args: unknown key 'margin'; this method knows temperature, kd_weight",
        ),
        (
            lambda c: (
                c["teachers"]["ta"].update(classes=["business", "entertainment", "sport"]),
                c["teachers"]["tb"].update(classes=["politics", "sport", "tech"]),
            ),
            r"students\.s_vkd: teachers \['ta', 'tb'\] overlap on class 'sport'.*disjoint or identical",
        ),
        # the classes are checked against the data when the DAG is built, before any teacher trains
        (
            lambda c: c["teachers"]["ta"].update(classes=["business"]),
            r"students\.s_vkd: label 'entertainment' in the data is covered by no teacher "
            r"\(ta: business; tb: politics, sport, tech\)",
        ),
        (
            lambda c: c["teachers"]["ta"].update(classes=["business", "sports"]),
            r"teachers\.ta\.classes: class 'sports' is not in the data",
        ),
        # an empty list is refused where the plan would replace it (by one seed, by every teacher, by no ensemble)
        (
            lambda c: c["students"]["s_vkd"].update(seeds=[]),
            r"^students\.s_vkd\.seeds: an empty list would train the student once, with seed 0; omit the key for "
            r"that, or list the seeds, e\.g\. \[0, 1, 2\]$",
        ),
        (
            lambda c: c["student_defaults"].update(seeds=[], seed=4),
            r"^student_defaults\.seeds: an empty list would train the student once, with seed 4; omit the key",
        ),
        (
            lambda c: c["students"]["s_vkd"].update(teachers=[]),
            r"^students\.s_vkd\.teachers: an empty list would mean every teacher; omit the key for that, or name "
            r"the teachers, e\.g\. \[ta, tb\]$",
        ),
        (
            lambda c: c["teachers"]["tb"].update(ensemble={}),
            r"^teachers\.tb\.ensemble: empty, which would mean a single teacher; omit the key for that, or write "
            r"\{size: N\} or \{seeds: \[0, 1, \.\.\.\]\} for an ensemble$",
        ),
        (
            lambda c: c["students"]["s_vkd"].update(model={"init": {"from": "builtin:tiny-bert", "layers": []}}),
            r"^students\.s_vkd\.model\.init\.layers: an empty list keeps no layer; omit the key to keep every layer",
        ),
        (
            lambda c: c["evaluate"].update(splits=[]),
            r"^evaluate\.splits: an empty list evaluates no model, so the report has nothing to show; omit the key",
        ),
    ],
)
def test_config_errors_name_the_key(edit, message):
    with pytest.raises(KdpipeError, match=message):
        load(edit=edit)


def test_an_empty_teacher_list_of_a_baseline_means_what_it_says():
    plan = load(edit=lambda c: c["students"]["s_none"].update(teachers=[]))  # supervised: no teacher either way
    assert plan.student_teachers("s_none") == []


@pytest.mark.parametrize(
    "written, message",
    [
        # YAML 1.1 reads a float only with a dot and a signed exponent: these are strings
        (
            "teachers: {ta: {lr: 1e-3}}",
            "teachers.ta.lr is the string '1e-3': YAML reads 1e-3 without a dot as text; write 1.0e-3 or 0.001",
        ),
        (
            "teacher_defaults: {lr: 5E-5}",
            "teacher_defaults.lr is the string '5E-5': YAML reads 5E-5 without a dot as text; write 5.0e-5 or 0.00005",
        ),
        (
            "students: {s: {lr: 1.0e4}}",
            "students.s.lr is the string '1.0e4': YAML reads 1.0e4 without a sign in the exponent as text; "
            "write 1.0e+4 or 10000",
        ),
        (
            "dataset: {split: {test: '0.2'}}",
            "dataset.split.test is the string '0.2': a number in quotes is text to YAML; write 0.2 without quotes",
        ),
        (
            "students: {s: {epochs: 3e0}}",
            "students.s.epochs is the string '3e0': YAML reads 3e0 as text, and students.s.epochs takes an integer; "
            "write 3",
        ),
        (
            "teachers: {ta: {ensemble: {seeds: [0, '1']}}}",
            "teachers.ta.ensemble.seeds[1] is the string '1': a number in quotes is text to YAML; write 1 without "
            "quotes",
        ),
        (
            "mc_dropout: {dropout: 1e-1}",
            "mc_dropout.dropout is the string '1e-1': YAML reads 1e-1 without a dot as text; write 1.0e-1 or 0.1",
        ),
        # the declared arguments of methods and teacher objectives, and a first stage's training settings
        (
            "students: {s: {method: prokt, method_args: {teacher_lr: 3e-5}}}",
            "students.s.method_args.teacher_lr is the string '3e-5': YAML reads 3e-5 without a dot as text; "
            "write 3.0e-5 or 0.00003",
        ),
        (
            "student_defaults: {method: meta_kd}\nstudents: {s: {method_args: {stage1: {lr: 1e-4}}}}",
            "students.s.method_args.stage1.lr is the string '1e-4': YAML reads 1e-4 without a dot as text; "
            "write 1.0e-4 or 0.0001",
        ),
        (
            "teachers: {m: {objective: meta, objective_args: {gamma: 5e-1}}}",
            "teachers.m.objective_args.gamma is the string '5e-1': YAML reads 5e-1 without a dot as text; "
            "write 5.0e-1 or 0.5",
        ),
    ],
)
def test_a_number_yaml_reads_as_text_is_named_with_its_spelling(written, message):
    config = yaml.safe_load(written)
    with pytest.raises(KdpipeError) as err:
        check_numbers(config, SCHEMA)
    assert str(err.value) == message


def test_numbers_and_text_that_only_look_like_numbers_pass():
    tiny = yaml.safe_load((REPO / "tests/configs/tiny.yaml").read_text())
    check_numbers(tiny, SCHEMA)
    check_numbers(yaml.safe_load("teachers: {ta: {lr: 1.0e-3, backbone: '1e3', domain: '2'}, tb: null}"), SCHEMA)
    check_numbers(yaml.safe_load("students: {s: {method: nope, method_args: {x: 1e-3}}}"), SCHEMA)  # named later


def test_warn_below_is_in_no_route_or_student_slice():
    """routing.warn_below only sets when the report warns: changing it leaves every route's and every student's
    slice (and the route's declared inputs) as they were, and changes the report's slice only."""

    def shipped(config):  # s_vkd as int8: the report then flags its accuracy drop
        config["export"] = {"int8": True, "students": ["s_vkd"]}

    def lower_threshold(config):
        shipped(config)
        config["routing"] = {**config.get("routing", {}), "warn_below": 0.3}

    plan, lowered = load(edit=shipped), load(edit=lower_threshold)
    assert plan.routes() and plan.routes() == lowered.routes()
    for route in plan.routes():
        assert lowered.route_params(route) == plan.route_params(route)
        assert "warn_below" not in str(plan.route_params(route))
        assert lowered.route_inputs(route) == plan.route_inputs(route)
    for student in plan.students:
        assert lowered.student_params(student) == plan.student_params(student)
        assert lowered.route_files(student) == plan.route_files(student)
    drop = {"max_accuracy_drop": 0.01}  # (the default margin of export.max_accuracy_drop)
    assert (plan.report_params(), lowered.report_params()) == ({"warn_below": 0.8, **drop}, {"warn_below": 0.3, **drop})


def test_a_route_slice_names_the_signals_its_rule_declares():
    plan = load()
    for route in plan.routes():
        signals = plan.route_params(route)["signals"]
        declared = {
            tuple(path.split("/")[-3:-1]) + (path.split("/")[-1].split(".")[0],) for path in plan.route_inputs(route)
        }
        teachers = plan.routes()[route]["teachers"]
        assert declared == {(t, split, name) for t in teachers for split, names in signals.items() for name in names}
    # s_muki's MC certainty reads the MC-dropout signal on both splits; s_muki_no_mc's logits score only on the
    # splits of mc_dropout.splits (for the diagnostics)
    routes = {spec.get("score"): route for route, spec in plan.routes().items()}
    assert plan.route_params(routes["entropy"])["signals"]["validation"] == ["logits", "pooled", "mc"]
    no_mc = plan.route_params(routes["logit_entropy"])["signals"]
    mc_splits = plan.mc_splits()
    assert no_mc == {s: ["logits", "pooled", *(["mc"] if s in mc_splits else [])] for s in ("train", "validation")}


def test_a_whole_float_for_an_integer_key_stops_the_plan():
    """JSON Schema reads 17.0 as an integer, the stage that uses it does not: the plan refuses it in one line."""
    with pytest.raises(KdpipeError, match=r"^export\.opset: 17\.0 is not an integer; write 17$"):
        check_numbers(yaml.safe_load("export: {opset: 17.0}"), SCHEMA)
    with pytest.raises(KdpipeError, match=r"^teachers\.ta\.epochs: 2\.0 is not an integer; write 2$"):
        check_numbers(yaml.safe_load("teachers: {ta: {epochs: 2.0}}"), SCHEMA)
    check_numbers(yaml.safe_load("teachers: {ta: {lr: 1.0}}"), SCHEMA)  # a number key takes it


def test_exports_and_serving_profiles_are_planned_by_name():
    """export.students and serving.models by config entry: a student with seeds stands for its first seed, its
    exported models too; a name that is no model stops the plan in one line (the workflow asks for both lists as it
    is parsed), also while nothing is exported."""

    def seeded(config, serving, export=None):
        config["students"]["s_vkd"]["seeds"] = [1, 2]
        config["export"] = export or {"int8": True, "students": ["s_vkd"]}
        config["serving"] = {"models": serving}

    plan = load(edit=lambda c: seeded(c, ["s_vkd", "s_vkd.int8", "ta"]))
    assert plan.serving_models() == ["s_vkd.seed1", "s_vkd.seed1.int8", "ta"]
    assert sorted(plan.exported()) == ["s_vkd.seed1.int8", "s_vkd.seed1.onnx", "s_vkd.seed2.int8", "s_vkd.seed2.onnx"]
    assert plan.evaluated_exports() == ["s_vkd.seed1.int8", "s_vkd.seed2.int8"]
    assert plan.export_params("s_vkd.seed2.int8") == {
        "model": "s_vkd.seed2.int8",
        "student": "s_vkd.seed2",
        "max_accuracy_drop": 0.01,
    }
    with pytest.raises(KdpipeError, match=r"^serving\.models names 's_vkd\.onnx', which is no model of this run"):
        load(edit=lambda c: seeded(c, ["s_vkd.onnx"], {"int8": False, "students": ["s_vkd"]})).serving_models()
    with pytest.raises(KdpipeError, match=r"^export\.students names 's_typo', which is no student"):
        load(edit=lambda c: seeded(c, [], {"int8": False, "students": ["s_typo"]})).exported()
