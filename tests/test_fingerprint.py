"""Code fingerprints follow each stage's kdpipe imports, so an edit reruns only the stages that use it; teacher-side
stages import nothing of the student side (docs/design.md, "Layers")."""

import shutil

import pytest

from kdpipe.core import fingerprint as fp
from kdpipe.methods.registry import METHODS, TEACHER_OBJECTIVES
from kdpipe.signals.catalog import SIGNALS
from kdpipe.stages.catalog import STAGES


def closure(*modules) -> set[str]:
    """The closure as paths relative to the package, e.g. ``signals/mc_dropout.py``."""
    return {str(p.relative_to(fp.PACKAGE_ROOT)) for p in fp.module_closure(*modules)}


# Student-side code: a teacher-side job must not carry any of it in its fingerprint.
STUDENT_SIDE = (
    "methods/",
    "models/students.py",
    "models/bilstm.py",
    "models/multihead.py",
    "stages/distill.py",
    "stages/cotrain.py",
    "signals/load.py",
    "training/student.py",
)
# Meta-KD's teacher-side parts, which the teacher-side stages of a Meta-KD run import (by name or statically).
META_TEACHER_SIDE = {
    "methods/__init__.py",
    "methods/meta_kd/__init__.py",
    "methods/meta_kd/prototypes.py",
    "methods/meta_kd/teacher.py",
    "methods/meta_kd/branch.py",
    "methods/meta_kd/domain.py",
    "methods/meta_kd/settings.py",
}
TEACHER_STAGES = (
    "prepare",
    "transfer",
    "finetune-teacher",
    "import-teacher",
    "prototypes",
    "signal-pass",
    "signal-shard",
    "signal-gather",
    "llm-import",
    "prompt-pass",
    "prompt-shard",
    "prompt-gather",
    "route",
    "route-transfer",
)


def student_side(files: set[str]) -> set[str]:
    return {f for f in files if f.startswith(STUDENT_SIDE) and f not in META_TEACHER_SIDE}


@pytest.mark.parametrize("stage", TEACHER_STAGES)
def test_teacher_side_stages_import_nothing_of_the_student_side(stage):
    assert not student_side(closure(STAGES[stage].module))


@pytest.mark.parametrize(
    "module",
    sorted(
        {s.module for s in SIGNALS.values()}
        | {o.module for o in TEACHER_OBJECTIVES.values()}
        | {"kdpipe.signals.forward"}  # the shared forward pass, imported by name by the pass jobs
    ),
)
def test_modules_teacher_side_jobs_import_by_name_stay_teacher_side(module):
    assert not student_side(closure(module))


def module_file(module: str) -> str:
    return module.removeprefix("kdpipe.").replace(".", "/") + ".py"


def test_a_method_module_is_in_its_students_closure_only():
    distill = closure("kdpipe.stages.distill")
    assert not any(f.endswith(("uhc.py", "muki.py", "registry.py", "bilstm.py", "multihead.py")) for f in distill)
    method_files = {module_file(spec.module) for spec in METHODS.values()}
    for spec in METHODS.values():
        own = closure(spec.module)
        assert module_file(spec.module) in own
        assert own & method_files == {module_file(spec.module)}, f"{spec.module} imports another method's module"


def test_an_edit_changes_only_the_fingerprints_that_include_the_file(tmp_path, monkeypatch):
    copy = tmp_path / "kdpipe"
    shutil.copytree(fp.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fp, "PACKAGE_ROOT", copy)
    fp.module_closure.cache_clear()
    stages = ("kdpipe.stages.finetune_teacher", "kdpipe.signals.mc_dropout", "kdpipe.signals.logits")
    before = {m: fp.fingerprint(m) for m in stages}
    with open(copy / "signals" / "mc_dropout.py", "a") as fh:
        fh.write("\n# an edit\n")
    fp.module_closure.cache_clear()
    after = {m: fp.fingerprint(m) for m in stages}
    fp.module_closure.cache_clear()
    assert after["kdpipe.stages.finetune_teacher"] == before["kdpipe.stages.finetune_teacher"]
    assert after["kdpipe.signals.logits"] == before["kdpipe.signals.logits"]
    assert after["kdpipe.signals.mc_dropout"] != before["kdpipe.signals.mc_dropout"]


def test_remembered_imports_follow_an_edit_and_a_rerun_parses_nothing(tmp_path, monkeypatch):
    """What each module imports is kept in .snakemake/kdpipe-imports.json under a hash of its source."""
    copy = tmp_path / "kdpipe"
    shutil.copytree(fp.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fp, "PACKAGE_ROOT", copy)
    monkeypatch.chdir(tmp_path)

    def new_run():  # a Snakemake run: nothing in memory, the memo read from disk
        fp.module_closure.cache_clear()
        fp._memo.cache_clear()

    new_run()
    before = closure("kdpipe.signals.logits")
    assert "methods/muki.py" not in before and (tmp_path / ".snakemake" / "kdpipe-imports.json").is_file()
    parse = fp._imported_names
    monkeypatch.setattr(fp, "_imported_names", lambda *a: pytest.fail("a module was parsed again"))
    new_run()
    assert closure("kdpipe.signals.logits") == before
    with open(copy / "signals" / "logits.py", "a") as fh:
        fh.write("\n\ndef _late():\n    from kdpipe.methods import muki  # noqa\n")
    monkeypatch.setattr(fp, "_imported_names", parse)
    new_run()
    after = closure("kdpipe.signals.logits")
    new_run()
    assert before < after and "methods/muki.py" in after


def test_the_code_identity_modules_do_not_import_each_other():
    """The fingerprint uses the library versions of kdpipe.core.identity; the identity takes the fingerprint as a
    value (docs/caching-and-reruns.md, "One identity per job") and imports none of it."""
    assert "core/identity.py" in closure("kdpipe.core.fingerprint")
    assert "core/fingerprint.py" not in closure("kdpipe.core.identity")
    for module in ("kdpipe.core.finished", "kdpipe.core.shared_cache", "kdpipe.training.checkpoint"):
        assert "core/fingerprint.py" not in closure(module), module
