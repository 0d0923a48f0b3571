"""docs/configuration.md is generated from kdpipe/config.schema.yaml and must stay in sync with it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "docs" / "make_configuration.py"
DOC = REPO / "docs" / "configuration.md"
FIX = "run `python docs/make_configuration.py` to regenerate docs/configuration.md"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("make_configuration", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def schema(gen):
    return gen.load_schema()


def test_doc_is_up_to_date(gen, schema):
    problem = gen.check(gen.generate(schema), DOC)
    assert problem is None, f"docs/configuration.md is stale: {FIX}.\n{problem}"


def test_generation_is_deterministic(gen, schema):
    assert gen.generate(schema) == gen.generate(gen.load_schema())


def test_every_top_level_key_has_a_section(schema):
    text = DOC.read_text(encoding="utf-8")
    headings = re.findall(r"^## (\S+)$", text, flags=re.M)
    missing = [key for key in schema["properties"] if key not in headings]
    assert not missing, f"top-level config keys without a section in docs/configuration.md: {missing}; {FIX}"
    assert headings == list(schema["properties"]), f"sections not in schema order; {FIX}"


def test_every_key_path_is_in_a_table(gen, schema):
    text = DOC.read_text(encoding="utf-8")
    paths = [row.path for key in schema["properties"] for row in gen.section_rows(key, schema)]
    assert "students.<name>.method_args" in paths
    missing = [path for path in paths if f"| `{path}` |" not in text]
    assert not missing, f"config keys missing from docs/configuration.md: {missing}; {FIX}"


def test_check_reports_a_stale_file(gen, schema, tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(gen.generate(schema).replace("## dataset", "## data"), encoding="utf-8")
    problem = gen.check(gen.generate(schema), stale)
    assert problem and "python docs/make_configuration.py" in problem and "+## dataset" in problem
    assert gen.check(gen.generate(schema), tmp_path / "absent.md").startswith(f"{tmp_path / 'absent.md'} is missing")


def test_cli_check_passes():
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, f"{FIX}.\n{result.stderr}"


@pytest.mark.parametrize(
    ("text", "line"),
    [("  lr: !!float 1e-3\n", None), ("  lr: !custom 1e-3\n", 3), ("\tlr: 0.001\n", 3), ("  title: 'open\n", 3)],
)
def test_what_configuration_md_says_of_yaml_snakemake_cannot_read_holds(tmp_path, text, line):
    """Snakemake's loader (which reads --configfile before kdpipe) reads YAML's standard tags, and answers a custom
    tag, a tab or an unclosed quote with its one message about tabs, as configuration.md says; the command the page
    gives for the parser's own message names the line."""
    from snakemake.common.configfile import load_configfile
    from snakemake_interface_common.exceptions import WorkflowError

    doc = DOC.read_text()
    message = (
        "Config file is not valid JSON or YAML. In case of YAML, make sure to not mix whitespace and tab indentation."
    )
    assert message in " ".join(doc.split())
    path = tmp_path / "your_config.yaml"
    path.write_text("teacher_defaults:\n  epochs: 1\n" + text)
    if line is None:
        assert load_configfile(str(path))["teacher_defaults"]["lr"] == 0.001
        return
    with pytest.raises(WorkflowError) as err:
        load_configfile(str(path))
    assert str(err.value) == message
    command = re.search(r'`\.venv/bin/python -c "([^"]+)" your_config\.yaml`', " ".join(doc.split())).group(1)
    result = subprocess.run([sys.executable, "-c", command, str(path)], capture_output=True, text=True)
    assert result.returncode != 0 and f"line {line}, column" in result.stderr
