"""Every kdpipe module a job of the tiny workflow imports is in that job's code fingerprint (docs/caching-and-reruns.md,
"Rerun rules"): the modules a stage imports by name, which the plan lists for the rules (kdpipe/plan/slices.py,
kdpipe/plan/passes.py), are checked against what each job, run afresh, really imported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdpipe.core.fingerprint import module_closure
from kdpipe.stages.catalog import STAGES
from tests.conftest import REPO
from tests.test_plan import load
from tests.test_workflow import copy_project, environment, snakemake

pytestmark = pytest.mark.slow

# Written into every Python process of the run (a sitecustomize on PYTHONPATH): at exit, a `python -m kdpipe` job
# records its command, log and the kdpipe modules it imported
RECORDER = """import atexit, json, os, sys

def _record():
    if not sys.argv[0].endswith(os.path.join("kdpipe", "__main__.py")):
        return
    modules = sorted(name for name in sys.modules if name.startswith("kdpipe."))
    record = {"argv": sys.argv[1:], "log": os.readlink("/proc/self/fd/2"), "modules": modules}
    with open(os.path.join(os.environ["KDPIPE_TEST_IMPORTS"], f"{os.getpid()}.json"), "w") as fh:
        json.dump(record, fh)

atexit.register(_record)
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> list[dict]:
    """The tiny workflow run, each job recording the kdpipe modules it imported."""
    base = tmp_path_factory.mktemp("imports")
    project = copy_project(base / "one")
    (base / "site").mkdir()
    (base / "site" / "sitecustomize.py").write_text(RECORDER)
    (base / "records").mkdir()
    env = environment(project, base / "cache")
    env.update(PYTHONPATH=f"{project}:{base / 'site'}", KDPIPE_TEST_IMPORTS=str(base / "records"))
    snakemake(project, env)
    return [json.loads(path.read_text()) for path in (base / "records").glob("*.json")]


def fingerprinted(plan, stage: str, log: Path) -> list[str]:
    """The modules a job's rule fingerprints (workflow/rules/*.smk): its stage's and those the plan names."""
    name = log.name.removesuffix(".log")
    by_name = {
        "finetune-teacher": lambda: plan.teacher_modules(name),
        "distill": lambda: plan.student_modules(name),
        "cotrain": lambda: plan.student_modules(name),
        "evaluate": lambda: plan.model_modules(name),
        "signal-pass": lambda: plan.pass_modules(log.parent.name.split("+")),
        "signal-gather": lambda: plan.signal_modules(log.parent.name),
    }
    assert stage != "signal-shard", "a shard job: add how its rule names its modules"
    return [STAGES[stage].module, *by_name.get(stage, list)()]


def names(*modules: str) -> set[str]:
    return {".".join(path.relative_to(REPO).with_suffix("").parts) for path in module_closure(*modules)}


def test_every_module_a_job_imported_is_in_its_code_fingerprint(recorded):
    plan = load()
    launcher = names("kdpipe.cli", "kdpipe.launch")  # what `python -m kdpipe` imports besides the stage
    stages = [next(arg for arg in record["argv"] if arg in STAGES) for record in recorded]
    assert len(recorded) > 20 and {"finetune-teacher", "signal-pass", "distill", "evaluate", "report"} <= set(stages)
    for stage, record in zip(stages, recorded):
        log = record["log"]
        closure = {name.removesuffix(".__init__") for name in names(*fingerprinted(plan, stage, Path(log)))}
        assert STAGES[stage].module in record["modules"]
        missing = set(record["modules"]) - closure - {n.removesuffix(".__init__") for n in launcher}
        assert not missing, f"{record['log']}: imported {sorted(missing)}, not in its code fingerprint"
