"""Edits of kdpipe while a job runs (docs/design.md, "Which kdpipe a job runs"): the code a job runs is the code its
fingerprint names. Each test holds a job at a named point of its start (kdpipe.launch.pause), edits a module there,
and lets it go on: an edit before the job's snapshot of the sources stops it in one line, an edit after it changes
nothing the job runs. With ``--cache``, a second working directory on the unedited checkout then links the
teacher only when it was made by the unedited code."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from kdpipe.launch import PAUSE_ENV
from tests.test_workflow import copy_project, environment, snakemake

# one teacher and nothing after it: the tests ask for the teacher's folder alone
CONFIG = """
dataset: {name: tiny_bbc, source: builtin:bbc_news, max_per_class: 6, split: {validation: 0.2, test: 0.2, seed: 1}}
teacher_defaults: {backbone: builtin:tiny-bert, epochs: 1, lr: 1.0e-3, batch_size: 8, max_length: 16}
teachers: {ta: {}}
students: {}
mc_dropout: {splits: []}
evaluate: {splits: [test]}
"""
EDIT = "\nraise RuntimeError('the edited kdpipe/training/loop.py ran')\n"


def test_a_module_imported_after_the_snapshot_comes_from_the_snapshot(tmp_path):
    """A job's process (as ``python -m kdpipe`` starts it): a module edited after the snapshot and imported only
    then is the module as the snapshot read it, and the job's fingerprint is computed from those bytes."""
    project = copy_project(tmp_path / "project")
    late = project / "kdpipe" / "report" / "markdown.py"
    code = (
        "import sys; from pathlib import Path\n"
        "from kdpipe.launch import Snapshot\n"
        "Snapshot().install()\n"
        "late = Path(sys.argv[1]); late.write_text(late.read_text() + '\\nEDITED = True\\n')\n"
        "import kdpipe.report.markdown as m\n"
        "from kdpipe.core.fingerprint import fingerprint, read_sources_from\n"
        "from kdpipe.launch import snapshot\n"
        "read_sources_from(snapshot().sources)\n"
        "print(hasattr(m, 'EDITED'), m.__file__ == str(late), fingerprint('kdpipe.report.markdown'))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(project), "PYTHONSAFEPATH": "1"}
    before = subprocess.run(
        [
            sys.executable,
            "-c",
            "from kdpipe.core.fingerprint import fingerprint as f; print(f('kdpipe.report.markdown'))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    result = subprocess.run([sys.executable, "-c", code, str(late)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", before]
    assert "EDITED = True" in late.read_text()


def run_with_an_edit(project: Path, env: dict, point: str) -> subprocess.CompletedProcess:
    """The teacher's run, its job held at ``point`` while kdpipe/training/loop.py is edited, then let go."""
    marker = project / f"paused-at-{point}"
    env = {**env, PAUSE_ENV: f"{point}@finetune-teacher={marker}"}

    finished = threading.Event()

    def edit_when_paused():
        while not marker.exists():
            if finished.wait(0.05):  # the run ended without pausing there
                return
        loop = project / "kdpipe" / "training" / "loop.py"
        loop.write_text(loop.read_text() + EDIT)
        marker.unlink()

    editor = threading.Thread(target=edit_when_paused)
    editor.start()
    try:
        return snakemake(project, env, "results/teachers/ta", "--cache", configfile="teacher.yaml", check=False)
    finally:
        finished.set()
        editor.join()


@pytest.mark.slow
@pytest.mark.parametrize(
    "point, edited_code_made_it", [("snapshot", True), ("run", False)], ids=["before-snapshot", "after-snapshot"]
)
def test_an_edit_while_a_cached_teacher_starts(tmp_path, point, edited_code_made_it):
    """Held before its snapshot, the edit stops the job in one line and nothing is cached: a second directory on
    the unedited checkout trains its own teacher. Held after it, the job runs the unedited code to the end, and the
    second directory links that teacher: it was made by the code its key names."""
    cache = tmp_path / "cache"
    cache.mkdir()
    first = copy_project(tmp_path / "first")
    (first / "teacher.yaml").write_text(CONFIG)
    result = run_with_an_edit(first, environment(first, cache), point)
    log = (first / "results" / "logs" / "finetune_teacher" / "ta.log").read_text()
    assert "the edited kdpipe/training/loop.py ran" not in log + result.stdout + result.stderr
    if edited_code_made_it:
        assert result.returncode != 0
        assert "the kdpipe code changed after this job was scheduled" in log
        assert not (first / "results" / "teachers" / "ta").exists()
        assert not any(p.is_dir() for p in cache.iterdir() if not p.name.startswith("."))
    else:
        assert result.returncode == 0, result.stderr[-3000:]
        assert "[kdpipe] finetune-teacher ta" in log  # the summary line: it ran to the end

    second = copy_project(tmp_path / "second")  # the unedited checkout
    (second / "teacher.yaml").write_text(CONFIG)
    snakemake(second, environment(second, cache), "results/teachers/ta", "--cache", configfile="teacher.yaml")
    log = second / "results" / "logs" / "finetune_teacher" / "ta.log"
    trained_here = log.exists() and "[kdpipe] finetune-teacher ta" in log.read_text()
    assert trained_here == edited_code_made_it
    weights = "results/teachers/ta/model.safetensors"
    if not edited_code_made_it:  # linked: the very weights the first directory made and stored
        assert (second / weights).resolve() == (first / weights).resolve()
        assert cache in (second / weights).resolve().parents
