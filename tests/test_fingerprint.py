"""Code fingerprints follow each stage's kdpipe imports, so an edit reruns only the stages that use it."""

import shutil

from kdpipe import fingerprint as fp


def names(*modules):
    return {p.name for p in fp.module_closure(*modules)}


def test_stage_closures_are_separate():
    teacher = names("kdpipe.teacher")
    assert {"teacher.py", "training.py", "data.py", "store.py", "__init__.py"} <= teacher
    assert "mc_dropout.py" not in teacher and "dump.py" not in teacher and "distill.py" not in teacher
    assert "mc_dropout.py" in names("kdpipe.mc_dropout")
    assert "teacher.py" not in names("kdpipe.mc_dropout")
    assert "vanilla_kd.py" in names("kdpipe.distill", "kdpipe.methods.vanilla_kd")
    assert "vanilla_kd.py" not in names("kdpipe.distill")


def test_an_edit_changes_only_the_fingerprints_that_include_the_file(tmp_path, monkeypatch):
    copy = tmp_path / "kdpipe"
    shutil.copytree(fp.PACKAGE_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(fp, "PACKAGE_ROOT", copy)
    fp.module_closure.cache_clear()
    before = {m: fp.fingerprint(m) for m in ("kdpipe.teacher", "kdpipe.mc_dropout")}
    with open(copy / "mc_dropout.py", "a") as fh:
        fh.write("\n# an edit\n")
    fp.module_closure.cache_clear()
    after = {m: fp.fingerprint(m) for m in ("kdpipe.teacher", "kdpipe.mc_dropout")}
    fp.module_closure.cache_clear()
    assert after["kdpipe.teacher"] == before["kdpipe.teacher"]
    assert after["kdpipe.mc_dropout"] != before["kdpipe.mc_dropout"]
