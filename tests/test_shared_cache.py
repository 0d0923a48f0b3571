"""Runs sharing one output cache (docs/caching-and-reruns.md, "Two runs at once"): real Snakemake runs of a small
Snakefile whose one cached rule writes a folder, as a teacher does, and records each time it "trains". Snakemake's
store is wrapped (slowed, or held open until the test lets it go) and the runs' clocks set apart, in a launcher
that patches Snakemake before running it. Each artifact is made once, its entry holds one copy, every run ends.
"""

from __future__ import annotations

import ast
import errno
import inspect
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kdpipe.core import shared_cache
from tests.conftest import REPO

SNAKEFILE = """
from kdpipe.core import shared_cache

shared_cache.install(workflow)


rule teacher:
    output:
        directory("results/teachers/t"),
    cache: True
    params:
        code="v1",
    shell:
        "echo trained >> $TRAINED; sleep 1; mkdir {output}.tmp; echo ${{RUN_TAG:-w}} > {output}.tmp/model.bin;"
        " echo m > {output}.tmp/manifest.json; mv {output}.tmp {output}"


rule signals:
    output:
        a="results/signals/a.txt",
        b="results/signals/b.txt",
    cache: True
    shell:
        "echo trained >> $TRAINED; echo a > {output.a}; echo b > {output.b}"
"""

# Snakemake with kdpipe's store slowed (STORE_S), or held until a file exists (STORE_GATE), or each output's rename
# into the cache slowed (RENAME_S: a Snakemake killed between two renames), and its clock set apart
LAUNCHER = """
import errno, os, shutil, sys, time
from pathlib import Path
from kdpipe.core import shared_cache

store = shared_cache._store

def slow_store(*args):
    print("storing", flush=True)
    gate = os.environ.get("STORE_GATE")
    while gate and not os.path.exists(gate):
        time.sleep(0.05)
    time.sleep(float(os.environ.get("STORE_S", "0")))
    return store(*args)

shared_cache._store = slow_store
remove, renames = shared_cache._remove, []

def slow_remove(path):  # (called for each entry just before its output is renamed into the cache)
    if Path(path).parent == Path(os.environ["SNAKEMAKE_OUTPUT_CACHE"]) and "RENAME_S" in os.environ:
        renames.append(path)
        print(f"renaming into the cache: output {len(renames)}", flush=True)
        if len(renames) > 1:
            time.sleep(float(os.environ["RENAME_S"]))
    return remove(path)

shared_cache._remove = slow_remove
# A cache on another file system that fills up: the copies out of the working directory after the first
# STORE_ENOSPC_AFTER fail with ENOSPC
after = os.environ.get("STORE_ENOSPC_AFTER")
if after is not None:
    copies = [int(after)]

    def copy(src, dst, *args, **kwargs):
        if copies[0] <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(dst))
        copies[0] -= 1
        return shutil.copy(src, dst)

    def across(source, target):
        if source.is_dir():
            shutil.copytree(source, target, copy_function=copy, symlinks=True)
        else:
            copy(source, target)

    shared_cache._copy = across
offset = float(os.environ.get("CLOCK_OFFSET_S", "0"))
for name in ("time", "monotonic"):
    real = getattr(time, name)
    setattr(time, name, lambda real=real: real() + offset)
from snakemake.cli import main
sys.argv[0] = "snakemake"
sys.exit(main())
"""


class Run:
    """One Snakemake run in its own working directory, its output read line by line as it comes."""

    def __init__(self, workdir: Path, cache: Path, *args: str, targets=("results/teachers/t",), **env: str):
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "Snakefile").write_text(SNAKEFILE)
        environment = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "SNAKEMAKE_OUTPUT_CACHE": str(cache),
            "TRAINED": str(cache.parent / "trained.txt"),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            **env,
        }
        command = [sys.executable, "-c", LAUNCHER, "--cores", "1", *targets, *args]
        self.workdir = workdir
        self.proc = subprocess.Popen(
            command, cwd=workdir, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"{self.workdir}: no line with {text!r}; got:\n{''.join(self.seen)}")

    def finish(self, timeout: float = 180) -> str:
        self.proc.wait(timeout=timeout)
        while (line := self.lines.get(timeout=30)) is not None:
            self.seen.append(line)
        return "".join(self.seen)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)


@pytest.fixture
def cache(tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    return folder


def trained(cache: Path) -> int:
    path = cache.parent / "trained.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def one_entry(cache: Path) -> Path:
    """The cache's one entry, a folder with the output's files and no folder inside it (no nested copy)."""
    entries = [entry for entry in cache.iterdir() if not entry.name.startswith(".")]
    assert len(entries) == 1, entries
    (entry,) = entries
    assert sorted(p.name for p in entry.iterdir()) == ["manifest.json", "model.bin"], "a nested copy in the entry"
    return entry


def assert_linked(runs: list[Run], entry: Path) -> None:
    for run in runs:
        assert (run.workdir / "results/teachers/t/model.bin").resolve() == (entry / "model.bin").resolve()


def finish_all(runs: list[Run]) -> list[str]:
    try:
        outputs = [run.finish() for run in runs]
    finally:
        for run in runs:
            run.kill()
    assert [run.proc.returncode for run in runs] == [0] * len(runs), "\n\n".join(outputs)
    return outputs


def test_three_directories_at_once_with_a_store_slowed_to_9_s(cache, tmp_path):
    runs = [Run(tmp_path / name, cache, "--cache", STORE_S="9") for name in ("one", "two", "three")]
    outputs = finish_all(runs)
    assert trained(cache) == 1
    assert sum("another run sharing the cache is making it" in out for out in outputs) >= 1, outputs
    assert_linked(runs, one_entry(cache))


@pytest.mark.parametrize("offset", [30, -30])
def test_a_store_held_open_is_waited_for_whatever_the_clocks_say(offset, cache, tmp_path):
    """The first run's store does not end until both other runs wait for it (a store of 90 s, or of any length):
    they wait without a limit, whatever their clocks (30 s ahead of or behind the first run's) and the lock file's
    time say, then link the entry."""
    gate = tmp_path / "store-may-end"
    first = Run(tmp_path / "one", cache, "--cache", STORE_GATE=str(gate))
    runs = [first]
    try:
        first.wait_for("storing")  # trained; its store is held open
        lock = next((cache / shared_cache.LOCKS).glob("*.lock"))
        os.utime(lock, (time.time() + offset, time.time() + offset))  # as a file server's clock would date it
        runs += [
            Run(tmp_path / name, cache, "--cache", CLOCK_OFFSET_S=str(offset), STORE_GATE=str(gate))
            for name in ("two", "three")
        ]
        for run in runs[1:]:
            said = run.wait_for("waiting for it to be stored")
            assert f"(pid {first.proc.pid} on " in said and str(first.workdir) in said
        time.sleep(3)
        assert trained(cache) == 1 and all(run.proc.poll() is None for run in runs)
        gate.touch()
    finally:
        outputs = finish_all(runs)
    assert trained(cache) == 1
    assert all("storing" not in out for out in outputs[1:])  # they linked the entry: nothing stored twice
    assert_linked(runs, one_entry(cache))


def test_a_run_without_cache_beside_one_with_it(cache, tmp_path):
    """The run without --cache neither looks the cache up nor stores: it makes its own output and never waits."""
    gate = tmp_path / "store-may-end"
    cached = Run(tmp_path / "one", cache, "--cache", STORE_GATE=str(gate))
    runs = [cached]
    try:
        cached.wait_for("storing")
        runs.append(Run(tmp_path / "two", cache))
        runs[1].proc.wait(timeout=120)  # while the other run's store is held open
        gate.touch()
    finally:
        outputs = finish_all(runs)
    assert "waiting" not in outputs[1] and "from cache" not in outputs[1] and "to cache" not in outputs[1]
    assert trained(cache) == 2  # once for the cache, once by the run that asked not to use it
    entry = one_entry(cache)
    assert_linked([cached], entry)
    own = runs[1].workdir / "results/teachers/t"
    assert own.is_dir() and not own.is_symlink() and not (own / "model.bin").is_symlink()


@pytest.mark.parametrize("broken", ["missing", "a file"])
def test_a_broken_cache_folder_stops_only_a_run_with_cache_and_in_one_line(broken, tmp_path):
    folder = tmp_path / "cache"
    if broken == "a file":
        folder.write_text("not a folder")
    why = {"missing": "it does not exist", "a file": "it is not a folder"}[broken]
    plain = Run(tmp_path / "plain", folder)
    assert plain.finish() and plain.proc.returncode == 0, "".join(plain.seen)
    cached = Run(tmp_path / "cached", folder, "--cache")
    out = cached.finish()
    assert cached.proc.returncode != 0
    (line,) = [line for line in out.splitlines() if why in line]
    assert f"SNAKEMAKE_OUTPUT_CACHE={folder}: {why}; --cache stores the cached rules' outputs there" in line
    assert "Traceback" not in out and not (tmp_path / "cached/results/teachers/t").exists()


@pytest.mark.parametrize(
    ("err", "why"),
    [
        (errno.EROFS, "it is on a read-only file system"),
        (errno.ENOSPC, "its file system is full"),
        (errno.EACCES, "you may not write to it"),
    ],
)
def test_folder_problem_names_a_read_only_or_full_folder(err, why, cache, monkeypatch):
    assert shared_cache.folder_problem(str(cache)) is None
    assert (cache / shared_cache.LOCKS).is_dir() and not [p for p in cache.iterdir() if p.is_file()]

    def fail(fd):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(shared_cache.os, "fsync", fail)  # where a full disk or a read-only mount shows
    assert shared_cache.folder_problem(str(cache)) == why


def test_no_decision_reads_a_clock():
    """The lock is the only thing the runs share: shared_cache reads no time, date or file time."""
    source = inspect.getsource(shared_cache)
    names = {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    imported = {
        alias.name
        for n in ast.walk(ast.parse(source))
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for alias in n.names
    }
    assert not {"time", "datetime"} & (names | imported)
    assert "mtime" not in source and "monotonic" not in source and "sleep" not in source


def test_the_lock_spans_snakemakes_look_up_run_and_store():
    """The wrapper replaces Snakemake's look-up, run and store of a cached job (``Executor.cached_or_run``, which
    calls ``acached_or_run``) with the same three steps in the same order under the lock: checked against the
    installed Snakemake, so that an upgrade that changes them is seen."""
    from snakemake.executors.local import Executor

    assert "acached_or_run" in inspect.getsource(Executor.cached_or_run)
    body = inspect.getsource(Executor.acached_or_run)
    fetch, run, store = (body.index(text) for text in ("cache.fetch(job)", "run_func(*args)", "cache.store(job)"))
    assert fetch < run < store
    ours = inspect.getsource(shared_cache._locked)
    fetch, run, store = (ours.index(text) for text in ("cache.fetch(job)", "run_func(*args)", "_store(workflow"))
    assert fetch < run < store


def test_the_installed_snakemake_is_one_the_lock_was_checked_with():
    """The lock wraps Snakemake's private executor and cache code: a Snakemake outside the releases it was checked
    with fails this test (and stops a run with --cache in one line), until it is checked and CHECKED says so."""
    import snakemake

    assert shared_cache.unchecked_snakemake() is None, snakemake.__version__
    assert shared_cache.unchecked_snakemake("9.17.0").startswith("Snakemake 9.17.0 is not one")
    assert shared_cache.unchecked_snakemake("10.0.1") is not None
    assert "9.18" in shared_cache.unchecked_snakemake("9.9")


def test_a_snakemake_killed_between_two_renames_of_a_store_leaves_no_entry_to_take(cache, tmp_path):
    """SIGKILL while the store puts the second of two outputs into the cache: the first is there whole, the second
    absent, and the working directory keeps its outputs. A second directory does not take the part entry: it makes
    its own and stores it whole; the killed directory's rerun then links it."""
    targets = ("results/signals/a.txt", "results/signals/b.txt")
    first = Run(tmp_path / "one", cache, "--cache", targets=targets, RENAME_S="60")
    first.wait_for("renaming into the cache: output 2")  # the first output is in; the second's rename waits
    first.kill()
    entries = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert len(entries) == 1 and entries[0].endswith(".txt")
    assert (cache / entries[0]).read_text() in ("a\n", "b\n")
    kept = [first.workdir / t for t in targets]
    assert all(p.exists() for p in kept) and sum(p.is_symlink() for p in kept) == 1
    finish_all([Run(tmp_path / "two", cache, "--cache", targets=targets)])
    assert trained(cache) == 2
    entries = sorted(p for p in cache.iterdir() if not p.name.startswith("."))
    assert [p.read_text() for p in entries] in (["a\n", "b\n"], ["b\n", "a\n"])
    assert not list((cache / shared_cache.LOCKS).glob("*.storing"))
    finish_all([Run(tmp_path / "one", cache, "--unlock", targets=targets)])  # (the killed run's lock on its folder)
    rerun = Run(tmp_path / "one", cache, "--cache", "--rerun-incomplete", targets=targets)
    finish_all([rerun])
    assert trained(cache) == 2  # linked: made once more only by the second directory
    for target in targets:
        assert (first.workdir / target).read_text() == Path(target).stem + "\n"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_run_stopped_while_it_waits_for_the_lock_ends_at_once_without_running_the_job(sig, cache, tmp_path):
    """Ctrl-C (SIGINT) or SIGTERM to a run whose job waits for another run's lock: the wait ends, the job fails
    without running (it would otherwise train once the holder ends), and the run exits; the holder goes on."""
    gate = tmp_path / "store-may-end"
    first = Run(tmp_path / "one", cache, "--cache", STORE_GATE=str(gate))
    runs = [first]
    try:
        first.wait_for("storing")
        second = Run(tmp_path / "two", cache, "--cache")
        second.wait_for("waiting for it to be stored")
        second.proc.send_signal(sig)
        second.proc.wait(timeout=180)  # before: it waited on (the holder ends only once the gate opens)
        out = second.finish()
        assert second.proc.returncode != 0
        assert "not run: the run was stopped while the job waited for the cache lock" in out, out
        assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
        assert trained(cache) == 1 and first.proc.poll() is None
        gate.touch()
    finally:
        gate.touch()
        outputs = finish_all(runs)
    assert trained(cache) == 1 and "Traceback" not in outputs[0]
    assert_linked(runs, one_entry(cache))
    assert not (tmp_path / "two/results/teachers/t").exists()


@pytest.mark.parametrize(
    ("targets", "after"),
    [(("results/teachers/t",), 1), (("results/signals/a.txt", "results/signals/b.txt"), 1)],
    ids=["a folder, cut short", "two files, the second fails"],
)
def test_a_store_that_fails_keeps_the_output_in_the_working_directory(targets, after, cache, tmp_path):
    """The cache fills up during the store (a copy across file systems that fails with ENOSPC): the job's outputs
    stay in the working directory, whole (a second output fails after the first was moved into the cache), the
    cache keeps nothing of them, one line says why, the run succeeds."""
    run = Run(tmp_path / "one", cache, "--cache", targets=targets, STORE_ENOSPC_AFTER=str(after))
    out = run.finish()
    assert run.proc.returncode == 0, out
    assert "Traceback" not in out
    (line,) = [line for line in out.splitlines() if "could not be stored in the shared cache" in line]
    assert f"could not be stored in the shared cache {cache} (its file system is full)" in line
    assert "the output stays in this working directory" in line
    assert trained(cache) == 1
    assert [p.name for p in cache.iterdir()] == [shared_cache.LOCKS]
    for target in targets:
        path = run.workdir / target
        files = [path / "model.bin", path / "manifest.json"] if path.suffix == "" else [path]
        assert not path.is_symlink() and all(f.is_file() and not f.is_symlink() for f in files), target
    assert [p.name for p in (run.workdir / Path(targets[0]).parent).iterdir() if "kdpipe" in p.name] == []


def test_a_lock_that_cannot_be_taken_fails_its_job_in_one_line(cache, tmp_path):
    first = Run(tmp_path / "one", cache, "--cache")
    assert first.finish() and first.proc.returncode == 0, "".join(first.seen)
    (lock,) = (cache / shared_cache.LOCKS).glob("*.lock")
    for entry in cache.iterdir():
        if entry.name != shared_cache.LOCKS:
            shutil.rmtree(entry)
    lock.unlink()
    lock.mkdir()  # (as root, a folder without write permission would not stop this test)
    second = Run(tmp_path / "two", cache, "--cache")
    out = second.finish()
    assert second.proc.returncode != 0
    assert f"results/teachers/t: cannot take the lock {lock} (" in out and "); not run" in out, out
    assert "Traceback" not in out and trained(cache) == 1


def test_folder_problem_names_a_locks_folder_it_may_not_write_to(cache, monkeypatch):
    locks = cache / shared_cache.LOCKS
    real = shared_cache.tempfile.TemporaryFile

    def refused(*args, dir=None, **kwargs):
        if Path(dir) == locks:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(shared_cache.tempfile, "TemporaryFile", refused)
    assert shared_cache.folder_problem(str(cache)) == f"its locks' folder {locks}: you may not write to it"


def test_a_dry_run_neither_checks_nor_writes_the_cache_folder(tmp_path):
    folder = tmp_path / "cache"
    run = Run(tmp_path / "one", folder, "--cache", "-n")
    out = run.finish()
    assert run.proc.returncode == 0, out
    assert "teacher" in out and not folder.exists()
    folder.mkdir()
    run = Run(tmp_path / "one", folder, "--cache", "-n")
    assert run.finish() and run.proc.returncode == 0 and list(folder.iterdir()) == []


def test_forcerun_with_cache_trains_again_and_replaces_the_entry(cache, tmp_path):
    """``--forcerun`` skips the look-up, trains, and replaces the entry under the lock (never nested): the other
    directory's links now read the new entry."""
    first = Run(tmp_path / "one", cache, "--cache", RUN_TAG="first")
    finish_all([first])
    finish_all([Run(tmp_path / "two", cache, "--cache", RUN_TAG="second")])  # linked
    assert trained(cache) == 1
    entry = one_entry(cache)
    assert (entry / "model.bin").read_text() == "first\n"
    forced = Run(tmp_path / "two", cache, "--forcerun", "teacher", "--cache", RUN_TAG="forced")
    finish_all([forced])
    assert trained(cache) == 2
    assert one_entry(cache) == entry and (entry / "model.bin").read_text() == "forced\n"
    assert_linked([first, forced], entry)
    assert (first.workdir / "results/teachers/t/model.bin").read_text() == "forced\n"
    assert list((cache / shared_cache.LOCKS).glob("*.storing")) == []
