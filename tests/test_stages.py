"""Every stage declared once (docs/design.md, "Stages"; docs/adding-a-stage.md): the declaration gives the command
line, the call into the stage's function and the rule's shell command, so an argument is added in one place."""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from kdpipe import cli
from kdpipe.core.settings import Settings
from kdpipe.stages import catalog
from kdpipe.stages.catalog import STAGES, Stage, read, text, written
from tests.conftest import REPO


@pytest.mark.parametrize("name", sorted(STAGES))
def test_each_stage_function_takes_its_settings_and_its_declared_arguments(name):
    stage = STAGES[name]
    function = getattr(importlib.import_module(stage.module), stage.function)
    signature = inspect.signature(function)
    first, *keywords = list(signature.parameters)  # (the first takes the stage's typed settings)
    assert typing.get_type_hints(function)[first] is stage.settings_type(), f"{stage.entry}: {first}"
    assert issubclass(stage.settings_type(), Settings)
    declared = {arg.name: arg for arg in stage.args}
    assert set(declared) <= set(keywords), f"{stage.entry} lacks {set(declared) - set(keywords)}"
    for keyword in keywords:
        default = signature.parameters[keyword].default
        if keyword not in declared:
            assert default is not inspect.Parameter.empty, f"{stage.entry}: {keyword} is never passed"
        elif declared[keyword].optional:
            assert default is not inspect.Parameter.empty, f"{stage.entry}: optional {keyword} has no default"
        else:
            assert default is inspect.Parameter.empty, f"{stage.entry}: {keyword} is always passed"


@dataclass(frozen=True)
class DemoSettings(Settings):
    k: int = 0


def test_the_rule_command_passes_each_argument_from_where_the_rule_has_it():
    args = (read("data"), read("extra", optional=True), text("note"), written("out"))
    stage = Stage("demo", "m:f", "", args, "m:DemoSettings")
    command = stage.shell({"data": "input", "out": "params"})
    assert command == (
        "python -m kdpipe --threads {threads} --log {log:q} demo --params {params.cfg:q} --code {params.code} "
        "--data {input.data:q} --out {params.out:q}"
    )
    trains = replace(stage, trains=True).shell({"data": "input", "out": "output", "extra": "input"})
    assert "--processes {resources.gpu}" in trains and trains.endswith("--out {output.out:q} --inputs {input:q}")
    with pytest.raises(ValueError, match="no value for --data"):
        stage.shell({"out": "output"})


def test_an_argument_is_added_in_one_place(monkeypatch, tmp_path):
    """One more entry in a stage's declaration: the command line takes its flag, the function gets it by name, and
    the rule's command passes it where the rule has it."""
    calls = []
    module = type(inspect)("kdpipe_demo_stage")
    module.work = lambda settings, data, note=None: calls.append((settings, data, note))
    module.DemoSettings = DemoSettings
    monkeypatch.setitem(__import__("sys").modules, "kdpipe_demo_stage", module)
    base = Stage("demo", "kdpipe_demo_stage:work", "a demo", (read("data"),), "kdpipe_demo_stage:DemoSettings")
    monkeypatch.setattr(catalog, "STAGES", {"demo": base})
    monkeypatch.setattr(cli, "STAGES", {"demo": base})
    with pytest.raises(SystemExit):
        cli.main(["demo", "--params", "{}", "--data", str(tmp_path), "--note", "hello"])

    added = replace(base, args=(read("data"), text("note")))  # the one edit
    monkeypatch.setattr(cli, "STAGES", {"demo": added})
    assert cli.main(["demo", "--params", '{"k": 1}', "--data", str(tmp_path), "--note", "hello"]) == 0
    assert calls == [(DemoSettings(k=1), tmp_path, "hello")]
    assert "--note {params.note:q}" in added.shell({"data": "input", "note": "params"})


def wired_stages() -> dict[str, list[str]]:
    """The stages the rule files wire (``stage("<name>", ...)``), with the files that wire them."""
    found: dict[str, list[str]] = {}
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        for name in re.findall(r'^ *stage\(\n\s*"([a-z-]+)",', path.read_text(), re.M):
            found.setdefault(name, []).append(path.name)
    return found


def test_every_stage_but_the_users_commands_has_a_rule():
    assert set(wired_stages()) == set(STAGES) - {"predict"}


def test_the_files_adding_a_stage_names_are_the_ones_it_takes():
    """docs/adding-a-stage.md's table names the files a new stage touches; each exists and holds what the table
    says it gets."""
    doc = (REPO / "docs" / "adding-a-stage.md").read_text()
    named = re.findall(r"^\| `([^`]+)`", doc, re.M)
    assert named == [
        "kdpipe/stages/catalog.py",
        "kdpipe/plan/slices.py",
        "kdpipe/plan/__init__.py",
        "kdpipe/config.schema.yaml",
        "docs/design.md",
    ]
    for path in named:
        assert (REPO / path).is_file(), path
    assert "def stage(" in (REPO / "workflow" / "rules" / "common.smk").read_text()
    assert "STAGE_RULES" in (REPO / "workflow" / "rules" / "stages.smk").read_text()
    assert "def targets(" in (REPO / "kdpipe" / "plan" / "__init__.py").read_text()
    assert "STAGES = {" in (REPO / "kdpipe" / "stages" / "catalog.py").read_text()
    # a stage module holds more than one call: none only forwards to a library function
    for path in sorted((REPO / "kdpipe" / "stages").glob("*.py")):
        if path.name not in ("__init__.py", "catalog.py"):
            assert len(path.read_text().splitlines()) > 30, f"{path.name} only forwards a call: point its entry at it"


def test_every_rule_is_made_by_the_one_skeleton():
    """No rule file writes a rule of its own: every rule comes from workflow/rules/stages.smk."""
    for path in sorted((REPO / "workflow" / "rules").glob("*.smk")):
        rules = re.findall(r"^\s*rule\b", path.read_text(), re.M)
        assert len(rules) == (1 if path.name == "stages.smk" else 0), path.name
    assert Path(REPO / "Snakefile").read_text().count("\nrule ") == 1  # rule all


def test_an_optional_path_left_out_or_given_without_a_value_is_none():
    """The rule writes an optional argument's flag even when the job has no value for it."""
    base = ["distill", "--data", "d", "--signals-root", "s", "--out", "o"]
    for extra, route, teacher_dirs in (([], None, []), (["--route", "--teacher-dirs"], None, [])):
        parsed = cli.parser().parse_args([*base, *extra])
        assert (parsed.route, parsed.teacher_dirs) == (route, teacher_dirs)
    parsed = cli.parser().parse_args([*base, "--route", "r", "--teacher-dirs", "a", "b"])
    assert (parsed.route, parsed.teacher_dirs, parsed.data) == (Path("r"), [Path("a"), Path("b")], Path("d"))
