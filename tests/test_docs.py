"""The documentation lives in the repository and matches the code: no reference points outside the project, every
docs/ file and section the code cites exists, every method argument is documented, the README stays short."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from kdpipe.methods.registry import METHODS, TEACHER_OBJECTIVES
from tests.conftest import REPO

TRACKED = [
    REPO / path
    for path in subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split()
    if (REPO / path).is_file()
]
TEXT_FILES = [p for p in TRACKED if p.suffix in {".py", ".md", ".smk", ".yaml", ".rst", ".toml", ""}]
OUTSIDE = re.compile(r"\.\./shared|\b(?:METHODS|DESIGN|ANCHORS|PLATFORM)\.md\b|\b[Ii]ssues? #?\d+\b")
THIS_FILE = "tests/test_docs.py"


def test_no_file_points_outside_the_project():
    found = []
    for path in TEXT_FILES:
        rel = str(path.relative_to(REPO))
        if rel == THIS_FILE:
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{rel}:{n}: {line.strip()[:100]}")
    assert not found, "references outside the repository:\n" + "\n".join(found)


DOC_REF = re.compile(r"docs/([\w./-]+\.md)(?:,? (§\d+[a-c]?)|, \"([^\"]+)\")?")


def headings(doc: str) -> str:
    return "\n".join(line for line in (REPO / "docs" / doc).read_text().splitlines() if line.startswith("#"))


def test_every_docs_reference_exists():
    missing = []
    for path in TEXT_FILES:
        for match in DOC_REF.finditer(path.read_text(errors="replace")):
            doc, section, title = match.groups()
            if not (REPO / "docs" / doc).is_file():
                missing.append(f"{path.relative_to(REPO)}: docs/{doc}")
            elif section and not re.search(rf"^#+ {re.escape(section)}\b", headings(doc), re.M):
                missing.append(f"{path.relative_to(REPO)}: docs/{doc} {section}")
            elif title and not re.search(rf"^#+ .*{re.escape(title)}", headings(doc), re.M):
                missing.append(f'{path.relative_to(REPO)}: docs/{doc}, "{title}"')
    assert not missing, "cited but not in docs/:\n" + "\n".join(sorted(set(missing)))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_and_its_arguments_are_in_methods_md(name):
    text = (REPO / "docs/methods.md").read_text()
    spec = METHODS[name]
    if not spec.internal:
        assert f"`{name}`" in text
    for arg in spec.args:
        # a two-stage method documents its first stage's arguments as `stage1.<name>`
        forms = (f"`{arg.name}`", f"`stage1.{arg.name}`", f"`{arg.name}.")
        assert any(form in text for form in forms), f"method_args {arg.name} of {name} is not in docs/methods.md"


@pytest.mark.parametrize("name", sorted(TEACHER_OBJECTIVES))
def test_teacher_objective_arguments_are_documented(name):
    text = (REPO / "docs/methods.md").read_text()
    for arg in TEACHER_OBJECTIVES[name].args:
        assert f"`{arg.name}`" in text


def test_readme_is_short_and_keeps_its_two_commands():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "make run" in readme and "make test" in readme
    for link in re.findall(r"\]\(((?:docs|benchmarks|experiments)/[^)#]+)", readme):
        assert (REPO / link).exists(), link


def test_every_kdpipe_name_in_code_and_docs_exists():
    """Dotted names and file paths of kdpipe in docstrings, comments and docs name something that exists."""
    import importlib

    def resolves(reference: str) -> bool:
        parts = reference.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            try:
                for attribute in parts[cut:]:
                    obj = getattr(obj, attribute)
            except AttributeError:
                return False
            return True
        return False

    stale = set()
    for path in TEXT_FILES:
        if path == REPO / "docs/adding-a-method.md":  # its examples name the modules a reader is about to write
            continue
        text = path.read_text(errors="replace")
        for match in re.finditer(r"\bkdpipe(?:\.[A-Za-z_]\w*)+", text):
            reference = match.group(0)
            if not reference.endswith(".yaml") and not resolves(reference):
                stale.add(f"{path.relative_to(REPO)}: {reference}")
        for match in re.finditer(r"\bkdpipe/[\w/]+\.py\b", text):
            if not (REPO / match.group(0)).exists():
                stale.add(f"{path.relative_to(REPO)}: {match.group(0)}")
    assert not stale, "names that do not exist:\n" + "\n".join(sorted(stale))


EXPERIMENT_SCRIPTS = sorted(str(p.relative_to(REPO / "experiments")) for p in (REPO / "experiments").rglob("*.py"))


@pytest.mark.parametrize("script", EXPERIMENT_SCRIPTS)
def test_experiment_scripts_run_their_help(script):
    """The experiments' helper scripts still import what they use from kdpipe (they run only on a finished run)."""
    r = subprocess.run([sys.executable, f"experiments/{script}", "--help"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_design_tables_are_generated_from_the_code():
    """docs/design.md's stage, signal and layer tables match STAGES, SIGNALS and every module's docstring."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_design", REPO / "docs" / "make_design.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.check() is None, module.check()
    text = (REPO / "docs" / "design.md").read_text()
    assert all(
        f"`{name}`" in text for name in ("signal-gather", "kdpipe.routing.build:build_route", "shared_cache", "pooled")
    )


EXPERIMENT_CONFIGS = sorted(p.name for p in (REPO / "experiments").glob("*.yaml"))
# overlays: laid over their base on the command line (each names its base in its header, as its command does)
OVERLAYS = {
    "amazon_little.yaml": "amazon_meta_kd.yaml",
    "amazon_single_domain.yaml": "amazon_meta_kd.yaml",
    "newsgroups_hydra_far.yaml": "newsgroups_hydra.yaml",
    "newsgroups_muki_groups.yaml": "newsgroups_muki.yaml",
    "newsgroups_muki_paper_m4.yaml": "newsgroups_muki_paper.yaml",
    "newsgroups_hydra_near.yaml": "newsgroups_hydra.yaml",
    "uncertainty_tech.yaml": "uncertainty.yaml",
}


@pytest.mark.parametrize("name", EXPERIMENT_CONFIGS)
def test_experiment_configs_pass_the_schema(name):
    """Every experiment config passes the config schema, an overlay laid over its base as its command lays it
    (planning would need each benchmark's data). A config without students of its own must be a listed overlay."""
    from snakemake.utils import update_config, validate

    from kdpipe.plan.entries import validate_entry

    path = REPO / "experiments" / name
    own = yaml.safe_load(path.read_text()) or {}
    config = {}
    if name in OVERLAYS:
        assert f"experiments/{OVERLAYS[name]}" in path.read_text().split("\n\n")[0], f"{name}: name its base"
        update_config(config, yaml.safe_load((REPO / "experiments" / OVERLAYS[name]).read_text()))
    else:
        assert "students" in own, f"{name}: no students; if it is an overlay, add it to OVERLAYS with its base"
    update_config(config, own)
    schema_path = REPO / "kdpipe" / "config.schema.yaml"
    schema = yaml.safe_load(schema_path.read_text())
    validate_entry(config, schema)
    validate(config, str(schema_path), set_default=True)
    assert config["students"] and config["evaluate"]["splits"]
