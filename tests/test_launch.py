"""Which kdpipe a job runs (docs/design.md, "Which kdpipe a job runs"): two checkouts and one environment, in which
the other checkout is installed (first on PYTHONPATH) and is the working directory; the jobs of a workflow import
its own checkout, and a job that imports another stops with one line naming both."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kdpipe import launch
from tests.conftest import REPO
from tests.test_workflow import copy_project


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory) -> tuple[Path, Path]:
    """Checkout A (the installed one, only its package) and checkout B (a whole project whose command line and
    prepare stage say they are B's)."""
    base = tmp_path_factory.mktemp("checkouts")
    a = base / "a"
    shutil.copytree(REPO / "kdpipe", a / "kdpipe", ignore=shutil.ignore_patterns("__pycache__"))
    b = copy_project(base / "b")
    cli = b / "kdpipe" / "cli.py"
    cli.write_text(cli.read_text().replace('"""``python -m kdpipe <stage> ...``', '"""Checkout B: ``kdpipe``', 1))
    with open(b / "kdpipe" / "data" / "prepare.py", "a") as fh:
        fh.write("\nimport pathlib\npathlib.Path('ran-from').write_text(__file__)\n")
    return a, b


def installed(a: Path) -> dict:
    """One environment with checkout A installed (first on PYTHONPATH: ahead of anything in site-packages)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONSAFEPATH", launch.PACKAGE_ENV)}
    return {**env, "PYTHONPATH": str(a), "HF_HUB_OFFLINE": "1"}


def test_a_job_that_imports_another_kdpipe_stops_naming_both(checkouts):
    a, b = checkouts
    env = {**installed(a), launch.PACKAGE_ENV: str(b / "kdpipe")}
    wrong = subprocess.run([sys.executable, "-m", "kdpipe", "--help"], cwd=a, env=env, capture_output=True, text=True)
    assert wrong.returncode == 1 and wrong.stdout == ""
    (line,) = wrong.stderr.splitlines()
    assert f"imported kdpipe from {a / 'kdpipe'}" in line and f"fingerprint from {b / 'kdpipe'}" in line
    env.update(launch.job_environment(env, package=b / "kdpipe"))
    right = subprocess.run([sys.executable, "-m", "kdpipe", "--help"], cwd=a, env=env, capture_output=True, text=True)
    assert right.returncode == 0 and "Checkout B" in right.stdout, right.stderr


@pytest.mark.parametrize("pythonpath", ["a", "a:b"])
def test_the_workflows_jobs_run_its_own_checkout_from_another_directory(checkouts, pythonpath):
    """`snakemake -s B/Snakefile -d A`, A installed: the job ran B's code, also with B itself on PYTHONPATH behind A
    (Snakemake adds the Snakefile's folder only when it is not on sys.path yet; the Snakefile puts it first)."""
    a, b = checkouts
    (a / "ran-from").unlink(missing_ok=True)
    cmd = [str(Path(sys.executable).parent / "snakemake"), "-s", str(b / "Snakefile"), "-d", str(a), "--cores", "1"]
    cmd += ["results/data/tiny_bbc", "--configfile", str(b / "tests/configs/tiny.yaml"), "--forceall"]
    env = {**installed(a), "PYTHONPATH": os.pathsep.join(str({"a": a, "b": b}[c]) for c in pythonpath.split(":"))}
    done = subprocess.run(cmd, cwd=a, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (a / "ran-from").read_text() == str(b / "kdpipe" / "data" / "prepare.py")
