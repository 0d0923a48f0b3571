"""Settings read once (docs/design.md, "Style"): each stage's typed settings accept exactly the slices the plan makes
and give them back key for key, refuse an unknown, missing or mistyped key with one line naming it, and below
kdpipe/stages/ no function takes a whole settings dict."""

from __future__ import annotations

import ast
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from kdpipe.cli import main
from kdpipe.core.settings import Args, Settings, freeze, from_schema, plain, renamed, schema_default
from kdpipe.core.store import KdpipeError, make_manifest
from kdpipe.plan import ORACLE, Plan
from kdpipe.stages.catalog import STAGES
from tests.conftest import REPO

CONFIGS = sorted(p.name for p in (REPO / "tests/configs").glob("*.yaml"))
PROMPTED_STAGES = ("llm-import", "prompt-pass", "prompt-shard", "prompt-gather", "evaluate-prompted")
BBC_LABELS = ["business", "entertainment", "politics", "sport", "tech"]  # builtin:bbc_news, in their order


def planned(name: str, where: Path, monkeypatch) -> Plan:
    """The plan of ``tests/configs/<name>`` as the workflow makes it (schema defaults filled in), run in ``where``
    with the data files the config names. The BBC News labels are given, not read: reading the corpus takes seconds
    and no slice holds a label."""
    from snakemake.utils import validate

    from tests.test_workflow_meta import domain_dataset
    from tests.test_workflow_pairs import pair_dataset

    (where / "data").mkdir(exist_ok=True)
    domain_dataset().to_csv(where / "data/domains.csv", index=False)
    pair_dataset().to_csv(where / "data/pairs.csv", index=False)
    monkeypatch.chdir(where)
    config = yaml.safe_load((REPO / "tests/configs" / name).read_text())
    validate(config, str(REPO / "kdpipe/config.schema.yaml"), set_default=True)
    if config["dataset"]["source"] == "builtin:bbc_news":
        monkeypatch.setattr(Plan, "data_labels", lambda self: BBC_LABELS)
    return Plan(config)


def stage_slices(plan: Plan) -> dict[str, list[dict]]:
    """Every job's config slice, by stage, as the rules ask the plan for them (workflow/rules/*.smk)."""
    out: dict[str, list[dict]] = {name: [] for name in STAGES}
    out["prepare"].append(plan.prepare_params())
    out["prototypes"].append(plan.prototype_params())
    out["report"].append(plan.report_params())
    if plan.has_transfer():
        out["transfer"].append(plan.transfer_params())
    if plan.ood_source():
        out["ood"].append(plan.ood_params())
    for teacher in plan.classifier_teachers():
        out["import-teacher" if plan.imported(teacher) else "finetune-teacher"].append(plan.teacher_params(teacher))
    out["llm-import"] += [plan.llm_params(llm) for llm in plan.llms()]
    for teacher, split in plan.prompt_passes():
        for stage in ("prompt-pass", "prompt-shard", "prompt-gather"):
            out[stage].append(plan.prompt_params(teacher, split))
    for signals, pairs in plan.passes().items():
        for teacher, split in pairs:
            out["signal-pass"].append(plan.pass_params(teacher, split, list(signals)))
            out["signal-shard"].append(plan.pass_params(teacher, split, list(signals)))
            out["signal-gather"] += [plan.signal_params(teacher, split, signal) for signal in signals]
    out["route"] += [plan.route_params(route) for route in plan.routes()]
    out["route-transfer"] += [plan.route_transfer_params(route) for route in plan.transfer_routes()]
    for stage in ("distill", "cotrain"):
        out[stage] += [plan.student_params(student) for student in plan.stage_students(stage)]
    for model in plan.models():
        combined = model in plan.ensembles or (model == ORACLE and plan.oracle)
        prompted = model in plan.teachers and plan.prompted(model)
        stage = "evaluate-ensemble" if combined else "evaluate-prompted" if prompted else "evaluate"
        out[stage].append(plan.eval_params(model))
    for model, (_, precision) in plan.exported().items():
        out["export" if precision == "onnx" else "quantize"].append(plan.export_params(model))
    out["serve"] += [plan.serving_params(model) for model in plan.serving_models()]
    return out


@pytest.mark.parametrize("config", CONFIGS)
def test_each_stage_reads_exactly_the_slices_the_plan_makes(config, tmp_path, monkeypatch):
    """Every slice of the test configs is read by its stage's settings type and given back exactly (the same JSON,
    key order included: what manifests record and job identities hash); one more key is refused in one line that
    names it, and so is a slice without one of the keys the type needs."""
    slices = stage_slices(planned(config, tmp_path, monkeypatch))
    for stage, made in slices.items():
        kind = STAGES[stage].settings_type()
        needed = [f.metadata.get("key", f.name) for f in dataclasses.fields(kind) if _required(f)]
        for params in made:
            settings = kind.from_params(params, "--params")
            assert json.dumps(settings.to_dict()) == json.dumps(params), (stage, params)
            assert settings.canonical() == json.dumps(params, sort_keys=True)
            with pytest.raises(KdpipeError, match=r"^--params: unknown key 'unplanned'; the keys are [^\n]*$"):
                kind.from_params({**params, "unplanned": 1}, "--params")
            for key in needed:
                with pytest.raises(KdpipeError, match=rf"^--params: missing key '{key}'$"):
                    kind.from_params({k: v for k, v in params.items() if k != key}, "--params")
    if config == "tiny.yaml":  # every stage of a run but the user's command and the external OOD set's
        assert {stage for stage, made in slices.items() if made} >= set(STAGES) - {
            "predict",
            "ood",
            "transfer",
            "route-transfer",
            "import-teacher",
            "cotrain",
            "export",  # (students to ship: tests/test_workflow.py's shipped run)
            "quantize",
            "serve",
            *PROMPTED_STAGES,
        }
    if config == "tiny_llm.yaml":  # a prompted teacher: its import, passes and evaluation
        assert {stage for stage, made in slices.items() if made} >= set(PROMPTED_STAGES)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


# ---- no function below kdpipe/stages/ takes a whole settings dict

# The names a whole config slice (or a part of one read as settings) went by before the settings were typed
SETTINGS_NAMES = {"params", "spec", "settings", "config", "cfg", "slice_", "config_slice", "dataset", "model_spec"}
ARGS_NAMES = {"args", "method_args", "objective_args"}  # a method's or a teacher objective's arguments
# the floors 0-6 (docs/design.md, "Layers"): everything but the plan, the stages and the launcher
ABOVE = ("kdpipe/stages/", "kdpipe/plan/", "kdpipe/cli.py", "kdpipe/launch.py", "kdpipe/__main__.py")
# Parameters so named that are no settings: the one function below the stages that the workflow itself calls with a
# config section (it reads the keys it needs and passes them on: workflow/rules/common.smk calls it with
# config["dataset"] when the DAG is built), and an exported folder's spec file (kdpipe_onnx.json), an artifact
NOT_SETTINGS = {
    "kdpipe/data/transfer_sources.py:check_transfer_files(dataset)",
    "kdpipe/models/export.py:_describe_export(spec)",
    "kdpipe/models/export.py:_finish_folder(spec)",
    "kdpipe/models/export.py:exported_card(spec)",
}


def settings_dict_parameters(root: Path = REPO) -> list[str]:
    """``file:function(parameter: annotation)`` for each parameter below the stages that takes a settings dict: one
    named as a config slice used to be (:data:`SETTINGS_NAMES`, :data:`ARGS_NAMES`) that is untyped or annotated
    ``dict``, ``Mapping`` or ``Any`` (but those of :data:`NOT_SETTINGS`)."""
    found = []
    for path in sorted((root / "kdpipe").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(ABOVE):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            arguments = node.args
            for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
                if arg.arg not in SETTINGS_NAMES | ARGS_NAMES or f"{rel}:{node.name}({arg.arg})" in NOT_SETTINGS:
                    continue
                annotation = ast.unparse(arg.annotation) if arg.annotation else ""
                if not annotation or any(word in annotation for word in ("dict", "Mapping", "Any")):
                    found.append(f"{rel}:{node.name}({arg.arg}: {annotation or 'untyped'})")
    return found


def test_no_function_below_the_stages_takes_a_settings_dict():
    assert settings_dict_parameters() == []


def test_the_scan_finds_a_settings_dict(tmp_path):
    """The control: the scan above finds what it looks for."""
    package = tmp_path / "kdpipe" / "data"
    package.mkdir(parents=True)
    made_up = "/".join(("kdpipe", "data", "made_up.py"))  # (a path that does not exist, as the docs check reads)
    (package / "made_up.py").write_text(
        "def a(params: dict): ...\ndef b(spec): ...\ndef c(args: Mapping): ...\ndef d(settings: DatasetSettings): ...\n"
        "def e(text_column: str): ...\n"
    )
    (tmp_path / "kdpipe" / "plan").mkdir()
    (tmp_path / "kdpipe" / "plan" / "y.py").write_text("def f(params: dict): ...\n")  # the plan may
    assert settings_dict_parameters(tmp_path) == [
        f"{made_up}:a(params: dict)",
        f"{made_up}:b(spec: untyped)",
        f"{made_up}:c(args: Mapping)",
    ]


def test_every_stage_names_a_settings_type_in_or_below_the_package_of_its_work():
    """A stage's settings type lives in (or below) the package that consumes it (docs/design.md, "Layers")."""
    from tests.test_layers import floor

    for stage in STAGES.values():
        module = stage.settings.partition(":")[0]
        assert issubclass(stage.settings_type(), Settings), stage.name
        assert floor(module)[0] <= floor(stage.module)[0], stage.name


# ---- the typed settings themselves


@dataclasses.dataclass(frozen=True)
class Inner(Settings):
    start: str = renamed("from")
    layers: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Outer(Settings):
    name: str
    rate: float
    count: int | None
    on: bool
    inner: Inner | None
    table: Mapping[str, str] | None = None
    later: str = from_schema("dataset", "conflicts")  # a key left out at the schema's default
    free: object = None


def test_settings_are_typed_read_only_and_give_back_their_slice():
    params = {"rate": 1, "name": "x", "count": None, "on": True, "inner": {"from": "m", "layers": [0, 5]}}
    settings = Outer.from_params(params, "here")
    assert settings.rate == 1 and isinstance(settings.rate, int)  # an integer is a number, and stays one
    assert settings.inner == Inner(start="m", layers=(0, 5)) and settings.later == "drop"
    assert settings.to_dict() == params and list(settings.to_dict()) == ["rate", "name", "count", "on", "inner"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.name = "y"
    free = Outer.from_params({**params, "free": {"a": [1, {"b": 2}]}, "table": {"k": "v"}}, "here")
    with pytest.raises(TypeError):
        free.free["a"] = 1  # nested JSON is read-only too
    assert free.free["a"][1]["b"] == 2 and free.to_dict()["free"] == {"a": [1, {"b": 2}]}
    # made by hand: every key but those at their defaults, in the fields' order
    assert Outer("x", 0.5, 3, False, None).to_dict() == {
        "name": "x",
        "rate": 0.5,
        "count": 3,
        "on": False,
        "inner": None,
    }


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"rate": "1"}, r"^here\.rate: expected a number, got \"1\" \(str\)$"),
        ({"on": 1}, r"^here\.on: expected true or false, got 1 \(int\)$"),
        ({"count": 1.5}, r"^here\.count: expected an integer or null, got 1\.5 \(float\)$"),
        ({"count": True}, r"^here\.count: expected an integer or null, got true \(bool\)$"),
        ({"inner": {"from": "m", "layers": [0, "5"]}}, r"^here\.inner\.layers\[1\]: expected an integer"),
        ({"inner": {"form": "m"}}, r"^here\.inner: unknown key 'form' \(did you mean 'from'\?\); the keys are from"),
        ({"inner": []}, r"^here\.inner: expected an object \(Inner\) or null, got \[\] \(list\)$"),
        ({"nmae": "x"}, r"^here: unknown key 'nmae' \(did you mean 'name'\?\); the keys are name, rate, count, on"),
    ],
)
def test_a_wrong_key_or_type_stops_with_one_line_naming_it(params, message):
    good = {"name": "x", "rate": 1.0, "count": None, "on": True, "inner": None}
    with pytest.raises(KdpipeError, match=message):
        Outer.from_params({**good, **params}, "here")


def test_a_missing_key_is_named_and_a_key_left_out_takes_the_schemas_default():
    with pytest.raises(KdpipeError, match=r"^here: missing key 'count'$"):
        Outer.from_params({"name": "x", "rate": 1.0, "on": True, "inner": None}, "here")
    assert schema_default("dataset", "split", "unlabelled") == 0 and schema_default("routing", "warn_below") == 0.8


def test_arguments_are_read_by_attribute_and_read_only():
    args = Args({"temperature": 2.0, "ramp": [1, 3]}, "students.s.method_args")
    assert args.temperature == 2.0 and args.ramp == (1, 3) and "ramp" in args and list(args) == ["temperature", "ramp"]
    assert args.to_dict() == {"temperature": 2.0, "ramp": [1, 3]}
    with pytest.raises(
        KdpipeError, match=r"^students\.s\.method_args: no argument 'alpha' \(it has temperature, ramp\)$"
    ):
        args.alpha  # noqa: B018
    with pytest.raises(AttributeError):
        args.temperature = 1.0


def test_method_args_come_from_the_registrys_declaration():
    from tests.conftest import method_args

    args = method_args("vanilla_kd", {"temperature": 4})
    assert args == Args({"temperature": 4, "hard_label_weight": 0.0}) and args.temperature == 4


def test_freeze_and_plain_are_inverse_on_json():
    value = {"a": [1, {"b": [None, True, 2.5]}], "c": "d"}
    assert plain(freeze(value)) == value and json.dumps(plain(freeze(value))) == json.dumps(value)


def test_a_manifest_records_the_settings_as_their_slice():
    params = {"rate": 1, "name": "x", "count": None, "on": True, "inner": None}
    assert make_manifest("thing", config=Outer.from_params(params))["config"] == params


def test_a_job_whose_slice_the_code_does_not_know_stops_in_one_line(tmp_path, capsys):
    """The command line reads the slice into the stage's settings before anything runs: an unknown key is exit
    status 2 and one line naming it, and nothing is written."""
    from tests.conftest import TINY_DATASET

    out = tmp_path / "data"
    status = main(["prepare", "--params", json.dumps({**TINY_DATASET, "colour": "red"}), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and not out.exists()
    assert err[-1].startswith("kdpipe prepare: error: --params: unknown key 'colour'; the keys are name, source")
    status = main(["prepare", "--params", json.dumps({**TINY_DATASET, "dedup": "yes"}), "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and err[-1] == 'kdpipe prepare: error: --params.dedup: expected true or false, got "yes" (str)'
