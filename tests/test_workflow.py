"""End to end: the whole DAG on the tiny config, then Snakemake dry-runs read to check what an edit reruns,
and the between-workflow cache reused from a second working directory.

The project (Snakefile, workflow/, kdpipe/, configs) is copied to a temporary directory so a test can edit the
kdpipe sources there; PYTHONPATH points at the copy, so both Snakemake and the jobs import the copy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from kdpipe.data.prepare import prepare
from kdpipe.signals.catalog import SIGNALS as SIGNAL_CATALOG
from kdpipe.signals.catalog import pass_of
from tests.conftest import REPO, TINY_DATASET, dataset_settings

pytestmark = pytest.mark.slow

STUDENTS = ("s_vkd", "s_vkd_ce", "s_uhc", "s_dfa", "s_muki", "s_muki_no_mc")  # distilled from ta and tb
BASELINE = "s_none"  # method supervised: no teacher, so no teacher-side change reruns it
PARTS = ("Snakefile", "config.yaml", "workflow", "kdpipe", "profiles", "envs", "tests/configs")


def copy_project(dest: Path) -> Path:
    for part in PARTS:
        src, dst = REPO / part, dest / part
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    return dest


def environment(project: Path, cache: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PYTHONPATH=str(project),
        SNAKEMAKE_OUTPUT_CACHE=str(cache),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        # the tests never read the hub: a name that is no builtin or folder fails at once, not after the hub's
        # timeouts (docs/your-own-models-and-data.md, "Model families")
        HF_HUB_OFFLINE="1",
    )
    return env


def snakemake(
    project: Path, env: dict, *args: str, configfile: str = "tests/configs/tiny.yaml", timeout=900, check=True
):
    """Snakemake's output; a failed run fails the test unless ``check`` is False (then the result is returned)."""
    cmd = [
        str(Path(sys.executable).parent / "snakemake"),
        "--profile",
        "profiles/cpu",
        "--configfile",
        configfile,
        "--cores",
        "2",
        *args,
    ]
    result = subprocess.run(cmd, cwd=project, env=env, capture_output=True, text=True, timeout=timeout)
    if not check:
        return result
    if result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    return result.stdout + result.stderr


def planned_jobs(project: Path, env: dict, configfile: str = "tests/configs/tiny.yaml") -> set[tuple[str, str]]:
    """The (rule, wildcards) of every job a dry-run would execute (rule `all` left out)."""
    text = snakemake(project, env, "--dry-run", configfile=configfile)
    jobs, rule = set(), None
    for line in text.splitlines():
        m = re.match(r"^(?:local)?rule ([\w+]+):", line)  # a pass's rule is named after its signals: logits+pooled
        if m:
            if rule and rule != "all":
                jobs.add((rule, ""))
            rule = m.group(1)
            continue
        m = re.match(r"^\s+wildcards: (.*)$", line)
        if m and rule:
            jobs.add((rule, m.group(1)))
            rule = None
    if rule and rule != "all":
        jobs.add((rule, ""))
    return jobs


def student_jobs(*students):
    return {
        job
        for s in students
        for job in (
            ("distill", f"student={s}"),
            ("evaluate", f"model={s}"),  # one job for both splits
        )
    }


def signal_jobs(teacher, *signals, shards=1, split="train"):
    """The jobs that make these signals of one teacher on a split (every signal its passes make there): at S = 1
    one job per pass, named after the signals it makes (``mc``; the shared forward's ``logits+pooled+hidden``, in
    catalog order); at S > 1 the shard jobs of each pass (rule signal_shard) and a gather job per signal (the rule
    named after it)."""
    wildcards = f"teacher={teacher}, split={split}"
    passes: dict[str, list[str]] = {}
    for signal in SIGNAL_CATALOG:
        if signal in signals:
            passes.setdefault(pass_of(signal), []).append(signal)
    if shards == 1:
        return {("+".join(names), wildcards) for names in passes.values()}
    return {(signal, wildcards) for signal in signals} | {
        ("signal_shard", f"{wildcards}, pass_name={name}, scatteritem={k}-of-{shards}")
        for name in passes
        for k in range(1, shards + 1)
    }


# the routes of the tiny config's MUKI students (docs/routing.md): s_muki's MC certainty, s_muki_no_mc's logits
ROUTES = {("route", "route=ta+tb.certainty-entropy"), ("route", "route=ta+tb.certainty-logit_entropy-T1")}


def edited_config(project: Path, edit, base: str = "tests/configs/tiny.yaml", name: str = "edited.yaml") -> str:
    config = yaml.safe_load((project / base).read_text())
    edit(config)
    path = project / "tests/configs" / name
    path.write_text(yaml.safe_dump(config))
    return f"tests/configs/{name}"


def writes_csv(relative: str, make_frame):
    """A ``setup`` for :func:`finished_project`: write ``make_frame()`` as a CSV at ``relative`` in the project."""

    def setup(project: Path) -> None:
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        make_frame().to_csv(project / relative, index=False)

    return setup


def finished_project(
    tmp_path_factory, name: str, *args: str, configfile: str = "tests/configs/tiny.yaml", setup=None, run_env=None
) -> tuple[Path, dict, Path]:
    """A copy of the project in a fresh folder ``base/one`` (``setup(project)`` may add files, e.g. data), its
    workflow run to completion once on ``configfile`` (with ``run_env(base, env)``'s variables); returns (project,
    env, base). ``base/cache`` is the between-workflow cache."""
    base = tmp_path_factory.mktemp(name)
    project = copy_project(base / "one")
    if setup is not None:
        setup(project)
    env = environment(project, base / "cache")
    (base / "cache").mkdir()
    snakemake(project, {**env, **(run_env(base, env) if run_env else {})}, *args, configfile=configfile)
    return project, env, base


# Written into every Python process of the first run (a sitecustomize on PYTHONPATH): at exit, a `python -m kdpipe`
# job records its command line and the kdpipe modules it imported
RECORDER = """import atexit, json, os, sys

def _record():
    if not sys.argv[0].endswith(os.path.join("kdpipe", "__main__.py")):
        return
    modules = sorted(name for name in sys.modules if name.startswith("kdpipe."))
    with open(os.path.join(os.environ["KDPIPE_TEST_IMPORTS"], f"{os.getpid()}.json"), "w") as fh:
        json.dump({"argv": sys.argv[1:], "modules": modules}, fh)

atexit.register(_record)
"""


def recording(base: Path, env: dict) -> dict:
    """The variables of a run whose jobs record what they imported, in ``base/records``."""
    (base / "site").mkdir()
    (base / "site" / "sitecustomize.py").write_text(RECORDER)
    (base / "records").mkdir()
    return {"PYTHONPATH": f"{env['PYTHONPATH']}:{base / 'site'}", "KDPIPE_TEST_IMPORTS": str(base / "records")}


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """The tiny workflow run to completion once, with the between-workflow cache on, every job recording the kdpipe
    modules it imported."""
    return finished_project(tmp_path_factory, "workflow", "--cache", run_env=recording)


def test_every_module_a_job_imported_is_in_its_code_fingerprint(done):
    """Every kdpipe module a job of the tiny workflow imported is in that job's code fingerprint
    (docs/caching-and-reruns.md, "Rerun rules"): its stage's module and the modules the rule names after the
    fingerprint in ``--code``, those the stage imports by name, with all they import; besides the launcher's."""
    from kdpipe.core.fingerprint import module_closure
    from kdpipe.stages.catalog import STAGES

    def names(*modules: str) -> set[str]:
        paths = module_closure(*modules)
        return {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in paths}

    _, _, base = done
    recorded = [json.loads(path.read_text()) for path in (base / "records").glob("*.json")]
    launcher = names("kdpipe.cli", "kdpipe.launch", "kdpipe.__main__")
    stages = [next(arg for arg in record["argv"] if arg in STAGES) for record in recorded]
    assert len(recorded) > 20 and {"finetune-teacher", "signal-pass", "distill", "evaluate", "report"} <= set(stages)
    for stage, record in zip(stages, recorded):
        code = record["argv"][record["argv"].index("--code") + 1]
        named = [m for m in code.partition(":")[2].split(",") if m]
        assert STAGES[stage].module in record["modules"]
        missing = set(record["modules"]) - names(STAGES[stage].module, *named) - launcher
        assert not missing, f"{stage} {' '.join(record['argv'])[:200]}: imported {sorted(missing)}, not fingerprinted"


def test_full_run_produces_every_artifact(done):
    project, _, _ = done
    r = project / "results"
    for path in (
        "data/tiny_bbc/train.parquet",
        "data/tiny_bbc/labels.json",
        "data/tiny_bbc/manifest.json",
        "teachers/ta/model.safetensors",
        "teachers/ta/labels.json",
        "teachers/ta/metrics.json",
        "teachers/ta/train_log.jsonl",
        "signals/tb/train/mc.npy",
        "signals/tb/train/mc.parquet",
        "signals/ta/train/logits.parquet",
        "students/s_vkd/model.safetensors",
        "eval/s_vkd/test.json",
        "eval/ta/validation.predictions.parquet",
        "report/summary.tsv",
        "report/summary.md",
        "report/reliability.png",
        "report/metrics.png",
        "signals/ta/validation/pooled.npy",
        "routes/ta+tb.certainty-entropy/route.json",
        "report/routing.md",
        "report/routing.png",
    ):
        assert (r / path).exists(), path
    # no model averages several members or heads: no uncertainty split (its epistemic part would be exactly 0)
    assert not (r / "report/uncertainty.png").exists()
    import pandas as pd

    summary = pd.read_csv(r / "report/summary.tsv", sep="\t")
    assert set(summary["model"]) == {"ta", "tb", "oracle", *STUDENTS, BASELINE}
    assert set(summary.loc[summary["kind"] == "student", "method"]) == {
        "supervised",
        "vanilla_kd",
        "uhc",
        "dfa",
        "muki",
        "muki_no_mc",
    }
    assert set(summary["split"]) == {"test", "validation"}


def test_the_report_opens_on_the_comparison(done):
    """`snakemake --report` lands on the title and the comparison table of every model, with no docutils message
    anywhere, and holds the curves, confusion matrices and cost plot."""
    project, env, _ = done
    snakemake(project, env, "--report", "report.html")
    page = (project / "report.html").read_text()
    assert "System Message" not in page and "Undefined substitution" not in page
    landing = json.loads(re.search(r"var workflow_desc = (\".*?\");\n", page).group(1))
    assert "<h2>Distillation on tiny_bbc</h2>" in landing
    assert all(f">{model}</td>" in landing for model in ("ta", "tb", "oracle", *STUDENTS, BASELINE))
    for figure in ("summary.html", "curves.png", "confusion.png", "cost.png", "metrics.png"):
        assert figure in page, figure
    assert "uncertainty.png" not in page  # no model has several members or heads


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(not CHROMIUM, reason="Chromium is not installed (.ci/run installs Debian's chromium)")
def test_the_report_opens_at_the_top_in_a_browser(done, tmp_path):
    """In a window shorter than the landing view, the title and the table are on screen when the page opens: the
    report viewer centres its views vertically, which would put them above the top of the window."""
    from PIL import Image

    project, env, _ = done
    snakemake(project, env, "--report", "report.html")
    shot = tmp_path / "landing.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1400,700", "--virtual-time-budget=8000",
         f"--screenshot={shot}", (project / "report.html").as_uri()],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    grey = np.asarray(Image.open(shot).convert("L"), dtype=float)
    content = grey[:, 260:1100]  # right of the menu, left of the rule graph
    inked = np.flatnonzero((content < 100).sum(1) > 20)  # rows with dark text or table lines
    # a blank margin, then the title within the first 120 px (centred, the window would open on the plots or on a
    # blank band), then the table and the plots down to the bottom of the window
    assert len(inked) and 20 < inked[0] < 120, f"the landing view starts {inked[0] if len(inked) else '-'} px down"
    assert len(inked) > 100


def test_the_default_route_is_mukis_certainty_bit_for_bit(done):
    """s_muki's route holds each teacher's cached MC certainty u unchanged, so MUKI as published is reproduced."""
    import pandas as pd

    from kdpipe.routing.artifact import read_route

    r = Path(done[0]) / "results"
    certainty = [pd.read_parquet(r / f"signals/{t}/train/mc.parquet") for t in ("ta", "tb")]
    row_ids = certainty[0]["row_id"].to_numpy()
    scores, manifest = read_route(r / "routes/ta+tb.certainty-entropy", "train", row_ids, ["ta", "tb"])
    for k, table in enumerate(certainty):
        assert scores[:, k].tobytes() == table["certainty"].to_numpy(np.float32).tobytes()
    assert manifest["weighting"] == "softmax" and not manifest["gold_labels"]
    assert {"certainty/entropy", "certainty/energy", "knn", "oracle"} <= set(manifest["diagnostics"])
    assert manifest["diagnostics"]["oracle"]["validation"]["routing"]["accuracy"] == 1.0


def test_muki_diagnostics_against_the_same_run_agrees_with_itself(done, capsys, monkeypatch):
    """experiments/muki_diagnostics.py on the tiny run, with --against the same run (docs/experiments/benchmarks.md,
    "MUKI with 16 MC-dropout samples"): each teacher's certainty correlates at 1 with itself, the same teacher
    scores highest on every row, and the owner's share is the one of its own MC-dropout line."""
    import runpy

    r = str(Path(done[0]) / "results")
    argv = ["muki_diagnostics.py", "--results", r, "--dataset", "tiny_bbc", "--teachers", "ta", "tb", "--against", r]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(REPO / "experiments/muki_diagnostics.py"), run_name="__main__")
    out = capsys.readouterr().out
    owner = re.search(r"\| MC-dropout certainty \| ([\d.]+)% \|", out).group(1)
    assert "certainty correlation ta 1.000, tb 1.000" in out
    assert "the same teacher scores highest on 100.0% of rows, 100.0% of the quarter with the largest m" in out
    assert f"the owner scores highest there on {owner}% of rows" in out


def test_muki_diagnostics_against_another_split_or_other_teachers_stops_before_its_report(done, tmp_path):
    """--against a run whose training split holds other texts, or whose teacher of the same name holds other
    classes (here ta and tb swapped): one line names the problem, and nothing of the report is printed first."""
    r = Path(done[0]) / "results"
    other = tmp_path / "results"
    shutil.copytree(r / "data", other / "data")
    (other / "signals").mkdir()
    for mine, theirs in (("ta", "tb"), ("tb", "ta")):
        shutil.copytree(r / "signals" / mine / "train", other / "signals" / theirs / "train")
    script = [sys.executable, str(REPO / "experiments/muki_diagnostics.py"), "--results", str(r)]
    args = ["--dataset", "tiny_bbc", "--teachers", "ta", "tb", "--against", str(other)]
    swapped = subprocess.run([*script, *args], capture_output=True, text=True)
    assert swapped.returncode != 0 and swapped.stdout == ""
    assert f"--against {other}: " in swapped.stderr and "differs from the expected" in swapped.stderr
    assert "Traceback" not in swapped.stderr
    shutil.rmtree(other / "data" / "tiny_bbc")  # the same dataset split with another seed
    config = yaml.safe_load((REPO / "tests/configs/tiny.yaml").read_text())["dataset"]
    resplit_data = {**TINY_DATASET, **config, "split": {**config["split"], "seed": 2}}
    prepare(dataset_settings(resplit_data), other / "data" / "tiny_bbc")
    resplit = subprocess.run([*script, *args], capture_output=True, text=True)
    assert resplit.returncode != 0 and resplit.stdout == ""
    assert f"--against {other}: its tiny_bbc training split holds other rows" in resplit.stderr


def test_a_routing_setting_reruns_the_routes_and_their_students_only(done):
    project, env, _ = done
    config = edited_config(project, lambda c: c.update(routing={"neighbours": 3}))
    assert planned_jobs(project, env, config) == {*ROUTES, *student_jobs("s_muki", "s_muki_no_mc"), ("report", "")}


def test_each_route_job_said_its_warning_and_a_new_threshold_reruns_the_report_only(done):
    """The route job says the warning the report gives (routing.warn_below, 0.8 here) in its log, which the rule
    also sends to Snakemake's output; a new threshold reaches the route jobs, yet reruns no route."""
    from kdpipe.report.routing import read_routes

    project, env, _ = done
    for route in ROUTES:
        name = route[1].removeprefix("route=")
        (recorded,) = read_routes([project / f"results/routes/{name}/route.json"], 0.8)
        said = (project / f"results/logs/route/{name}.log").read_text()
        assert ("[kdpipe] routing warning: " in said) == bool(recorded["warning"]), name
        assert not recorded["warning"] or recorded["warning"] in said
    config = edited_config(project, lambda c: c.update(routing={**c.get("routing", {}), "warn_below": 0.99}))
    assert planned_jobs(project, env, config) == {("report", "")}  # no route, no student
    # the new threshold reaches the route jobs (through their environment, kdpipe.routing.diagnostics.WARN_ENV)
    snakemake(project, env, "--forcerun", "route", "--until", "route", configfile=config)
    for route in ROUTES:
        said = (project / f"results/logs/route/{route[1].removeprefix('route=')}.log").read_text()
        assert "below routing.warn_below = 99%" in said, said


PREDICTIONS = ".predictions.parquet"


def test_the_default_config_has_one_evaluate_job_per_model(tmp_path):
    """One evaluate job per model writes both splits the default config evaluates on (validation, test), and one
    evaluate_ensemble job the teachers' oracle: 9 + 1 jobs (two teachers, six students, the int8 student) instead of
    one per model and split."""
    project = copy_project(tmp_path)
    env = environment(project, tmp_path / "cache")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    models = {*config["teachers"], *config["students"], *(f"{s}.int8" for s in config["export"]["students"])}
    assert len(models) == 9 and "splits" not in config["evaluate"]  # (the schema's default: validation, test)
    jobs = planned_jobs(project, env, configfile="config.yaml")
    assert {job for job in jobs if job[0].startswith("evaluate")} == {
        *(("evaluate", f"model={m}") for m in models),
        ("evaluate_ensemble", "ensemble=oracle"),
    }
    text = snakemake(project, env, "--dry-run", configfile="config.yaml")
    outputs = re.findall(r"^rule evaluate(?:_ensemble)?:\n(?:\s+input: .*\n)?\s+output: (.*)$", text, re.M)
    files = {m: {f"results/eval/{m}/{s}{kind}" for s in ("validation", "test") for kind in (".json", PREDICTIONS)}
             for m in (*models, "oracle")}  # fmt: skip
    assert sorted(sorted(output.split(", ")) for output in outputs) == sorted(map(sorted, files.values()))


# s_vkd shipped (export.int8, a profile of its int8 model): the jobs that make it, and what every change that reruns
# s_vkd reruns besides it
EXPORT = {"int8": True, "students": ["s_vkd"]}
SERVING = {"models": ["s_vkd.int8"], "rows": 20}
EXPORT_JOBS = {
    ("export", "model=s_vkd.onnx"),
    ("quantize", "model=s_vkd.int8"),
    ("evaluate", "model=s_vkd.int8"),
    ("serve", "model=s_vkd.int8"),
}


@pytest.fixture(scope="module")
def shipped(done):
    """The finished tiny run in a copy, with s_vkd exported to int8 and profiled: only those jobs and the report
    run."""
    project, env, base = done
    copy = base / "shipped"
    shutil.copytree(project, copy, symlinks=True)
    config = edited_config(copy, lambda c: c.update(export=EXPORT, serving=SERVING), name="shipped.yaml")
    assert planned_jobs(copy, env, config) == {*EXPORT_JOBS, ("report", "")}
    snakemake(copy, env, configfile=config)
    return copy, env, config


def test_the_int8_student_is_evaluated_against_its_student_and_served(shipped):
    """export.int8: s_vkd as an int8 ONNX graph, its card saying what quantisation cost on the validation rows,
    evaluated on the test rows against s_vkd's own predictions (in the report's exported table), profiled as it would
    be served, and run by `kdpipe predict`."""
    project, env, _ = shipped
    r = project / "results"
    record = json.loads((r / "eval/s_vkd.int8/test.json").read_text())
    assert record["exported"] == "int8" and record["base"] == "s_vkd.int8" and record["kind"] == "student"
    block = record["compared_with"]
    assert block["model"] == "s_vkd" and 0 <= block["agreement"] <= 1 and block["n"] == record["metrics"]["n"]
    low, high = block["accuracy_difference"]["low"], block["accuracy_difference"]["high"]
    assert low <= block["accuracy_difference"]["difference"] <= high
    assert "## Accuracy check" in (r / "exported/s_vkd.int8/README.md").read_text()
    assert "| s_vkd.int8 | s_vkd | int8 | test |" in (r / "report/exported.md").read_text()
    profile = json.loads((r / "serving/s_vkd.int8.json").read_text())
    assert profile["model"] == "s_vkd.int8" and profile["threads"] == 1 and profile["latency_ms"]["median"] > 0
    assert "s_vkd.int8" in (r / "report/serving.md").read_text()
    new = project / "new.csv"
    new.write_text("text\nthe minister announced a new budget\n")
    subprocess.run(
        [sys.executable, "-m", "kdpipe", "predict", "--model", str(r / "exported/s_vkd.int8"), "--input", str(new),
         "--out", str(project / "predicted.csv")], cwd=project, env=env, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    assert len(pd.read_csv(project / "predicted.csv")) == 1


def test_an_export_setting_reruns_only_the_export_its_evaluation_and_the_report(shipped):
    project, env, config = shipped
    int8 = {("quantize", "model=s_vkd.int8"), ("evaluate", "model=s_vkd.int8"), ("serve", "model=s_vkd.int8")}
    assert planned_jobs(project, env, config) == set()
    edited = edited_config(project, lambda c: c["export"].update(max_accuracy_drop=0.02), base=config)
    assert planned_jobs(project, env, edited) == {*int8, ("report", "")}
    edited = edited_config(project, lambda c: c["export"].update(opset=18), base=config)
    assert planned_jobs(project, env, edited) == {*EXPORT_JOBS, ("report", "")}
    edited = edited_config(project, lambda c: c["students"]["s_vkd"].update(lr=5e-4), base=config)
    assert planned_jobs(project, env, edited) == {*student_jobs("s_vkd"), *EXPORT_JOBS, ("report", "")}


def test_nothing_to_do_when_nothing_changed(done):
    project, env, _ = done
    assert planned_jobs(project, env) == set()


def test_student_lr_change_reruns_only_that_student(done):
    project, env, _ = done
    config = edited_config(project, lambda c: c["students"]["s_vkd"].update(lr=5e-4))
    assert planned_jobs(project, env, config) == {
        ("distill", "student=s_vkd"),
        ("evaluate", "model=s_vkd"),
        ("report", ""),
    }


def test_evaluate_splits_edited_reruns_each_models_one_evaluate_job(done):
    """The evaluate job of a model covers every split it is evaluated on (its slice names them): a split added or,
    as here, dropped reruns it, the oracle's and the report; nothing upstream (docs/caching-and-reruns.md)."""
    project, env, _ = done
    config = edited_config(project, lambda c: c["evaluate"].update(splits=["test"]))
    models = ("ta", "tb", BASELINE, *STUDENTS)
    assert planned_jobs(project, env, config) == {
        *(("evaluate", f"model={m}") for m in models),
        ("evaluate_ensemble", "ensemble=oracle"),
        ("report", ""),
    }


def test_teacher_epochs_change_reruns_that_teacher_and_downstream(done):
    project, env, _ = done
    config = edited_config(project, lambda c: c["teachers"]["ta"].update(epochs=2))
    jobs = planned_jobs(project, env, config)
    assert jobs == {
        ("finetune_teacher", "teacher=ta"),
        *signal_jobs("ta", "mc", "logits", "pooled", "hidden"),
        *signal_jobs("ta", "mc", "logits", "pooled", split="validation"),  # read by the routes
        *ROUTES,
        ("evaluate", "model=ta"),
        ("evaluate_ensemble", "ensemble=oracle"),
        ("report", ""),
        *student_jobs(*STUDENTS),
    }
    assert not any("tb" in wildcards for rule, wildcards in jobs if rule != "route")


def test_mc_dropout_source_edit_reruns_mc_dropout_not_teachers(done):
    project, env, _ = done
    source = project / "kdpipe/signals/mc_dropout.py"
    original = source.read_text()
    source.write_text(original + "\n# an edit\n")
    try:
        jobs = planned_jobs(project, env)
    finally:
        source.write_text(original)
    # MC-dropout of both teachers (train and, for s_muki's route, validation), the routes that read it (s_muki's,
    # and s_muki_no_mc's diagnostics compare the MC scores on train) and their students; not the teachers
    mc = {job for t in ("ta", "tb") for split in ("train", "validation") for job in signal_jobs(t, "mc", split=split)}
    assert jobs == {*mc, *ROUTES, *student_jobs("s_muki", "s_muki_no_mc"), ("report", "")}


def edited_sources(project: Path, files: list[Path]):
    """Append a comment to each file; returns a function that restores them."""
    originals = {path: path.read_text() for path in files}
    for path, text in originals.items():
        path.write_text(text + "\n# an edit\n")
    return lambda: [path.write_text(text) for path, text in originals.items()]


def test_student_side_edits_leave_every_teacher_side_job_up_to_date(done):
    """Every file of kdpipe/methods/ and the student architectures edited: only students, their evaluations and
    the report rerun; no data, teacher, signal or teacher-evaluation job."""
    project, env, _ = done
    kdpipe = project / "kdpipe"
    restore = edited_sources(
        project,
        [*sorted((kdpipe / "methods").rglob("*.py")), kdpipe / "models/bilstm.py", kdpipe / "models/multihead.py"],
    )
    try:
        jobs = planned_jobs(project, env)
    finally:
        restore()
    assert jobs == {*student_jobs(*STUDENTS, BASELINE), ("report", "")}


def test_one_method_edit_reruns_only_that_methods_students(done):
    project, env, _ = done
    restore = edited_sources(project, [project / "kdpipe/methods/uhc.py"])
    try:
        jobs = planned_jobs(project, env)
    finally:
        restore()
    assert jobs == {*student_jobs("s_uhc"), ("report", "")}


def test_a_misspelt_method_arg_stops_the_run_before_any_job(done):
    project, env, _ = done
    config = edited_config(project, lambda c: c["students"]["s_vkd"].update(method_args={"temprature": 1}))
    result = snakemake(project, env, "--dry-run", configfile=config, timeout=300, check=False)
    assert result.returncode != 0
    assert (
        "students.s_vkd.method_args: unknown key 'temprature' (did you mean 'temperature'?); this method knows "
        "temperature, hard_label_weight"
    ) in result.stdout + result.stderr
    assert "rule distill" not in result.stdout


def test_sharded_signals_are_the_same_bytes_as_unsharded(done):
    """S = 3 shards per pass (from the command line), in a second directory: the same artifacts, byte for byte. One
    teacher's (ta's: both kinds of pass, MC-dropout and the shared forward with hidden states; tb's passes are the
    same code on other weights, and each job is a process of its own)."""
    project, env, base = done
    other = copy_project(base / "sharded")
    names = ("mc.npy", "mc.parquet", "mc.json", "logits.parquet", "logits.json", *SIGNAL_CATALOG["hidden"].files)
    signals = [f"results/signals/ta/train/{name}" for name in names]
    # targets first: --cache (optional rule names) and --set-scatter (one or more values) would swallow them
    out = snakemake(other, env, *signals, "--cache", "--set-scatter", "mc_dropout=3", "dump=3")
    assert "signal_shard" in out and "scatteritem=3-of-3" in out
    for path in signals:
        assert (other / path).read_bytes() == (project / path).read_bytes(), path
    assert not list((other / "results/signals/ta/train/shards").glob("*")), "parts are temp files"


def signal_pass_jobs(jobs) -> dict[str, list[tuple[str, str]]]:
    """The jobs of signal passes in a job list by pass (``forward``, ``mc``): a whole pass's job, named after its
    signals, or a gather job named after its signal (then also ``shard``: the shard jobs)."""
    out: dict[str, list[tuple[str, str]]] = {}
    for rule, wildcards in sorted(jobs):
        if rule == "signal_shard":
            out.setdefault("shard", []).append((rule, wildcards))
        elif set(rule.split("+")) <= set(SIGNAL_CATALOG):
            out.setdefault(pass_of(rule.split("+")[0]), []).append((rule, wildcards))
    return out


def test_the_default_config_runs_one_forward_job_per_teacher_and_split(tmp_path):
    """The default config (`make run`), dry: every deterministic signal of a teacher on a split comes from one job
    (the shared forward pass; at S = 1 no shard and no gather job), MC-dropout from one job per teacher and split;
    with `dump.shards` S = 2, a teacher's forward on a split is 2 shard jobs whatever its signals, and a gather each."""
    project = copy_project(tmp_path / "default")
    env = environment(project, tmp_path / "cache")
    pairs = [f"teacher={t}, split={s}" for t in ("minilm_a", "minilm_b") for s in ("train", "validation")]
    passes = signal_pass_jobs(planned_jobs(project, env, configfile="config.yaml"))
    assert set(passes) == {"forward", "mc"}, "no shard job"
    assert sorted(w for _, w in passes["forward"]) == pairs
    assert {rule for rule, w in passes["forward"]} == {"logits+pooled+hidden", "logits+pooled"}
    assert all(rule == "logits+pooled+hidden" for rule, w in passes["forward"] if "split=train" in w)
    assert passes["mc"] == [("mc", w) for w in pairs]
    sharded = edited_config(project, lambda c: c.setdefault("dump", {}).update(shards=2), base="config.yaml")
    passes = signal_pass_jobs(planned_jobs(project, env, configfile=sharded))
    assert sorted(w for _, w in passes["shard"]) == [
        f"{w}, pass_name=forward, scatteritem={k}-of-2" for w in pairs for k in (1, 2)
    ]
    assert sorted(rule for rule, _ in passes["forward"]) == sorted(["logits"] * 4 + ["pooled"] * 4 + ["hidden"] * 2)
    assert passes["mc"] == [("mc", w) for w in pairs]


def test_cached_artifacts_are_reused_from_a_second_working_directory(done):
    """A second working directory links the teacher-side artifacts from the cache; its routes run no job, so the
    students that read them say the routing warning (at this run's routing.warn_below), in their logs and in
    Snakemake's output, before they train. It builds the two MUKI students only (each job a process of its own: the
    other students would add minutes and nothing to check); what is left to do after them is student-side only."""
    from kdpipe.report.routing import read_routes

    _, _, base = done
    project = copy_project(base / "two")
    env = environment(project, base / "cache")
    with open(project / "tests/configs/tiny.yaml", "a") as config:  # (appended: the other settings stay as written)
        config.write("\nrouting:\n  warn_below: 1.0\n")
    # targets first: --cache takes rule names
    out = snakemake(project, env, "results/students/s_muki", "results/students/s_muki_no_mc", "--cache")
    left = {rule for rule, _ in planned_jobs(project, env)}
    student_side = {"distill", "evaluate", "evaluate_ensemble", "report"}  # (the oracle: an ensemble's evaluation)
    assert "distill" in left and left <= student_side, f"teacher-side jobs left after linking from the cache: {left}"
    weights = project / "results/teachers/ta/model.safetensors"  # a cached directory's files are symlinked
    assert weights.is_symlink() and Path(os.path.realpath(weights)).is_relative_to(base / "cache")
    assert (project / "results/signals/tb/train/mc.npy").is_symlink()
    assert (project / "results/signals/ta/train/logits.parquet").is_symlink()
    # Snakemake touches the log of a job it took from the cache; nothing trained here, so it stays empty
    assert all(log.stat().st_size == 0 for log in (project / "results/logs/finetune_teacher").glob("*.log"))
    assert "Symlinking output file results/teachers/ta" in out
    for route in ROUTES:
        name = route[1].removeprefix("route=")
        assert (project / f"results/routes/{name}/route.json").is_symlink()  # linked: the route job did not run
        assert (project / f"results/logs/route/{name}.log").stat().st_size == 0
        (recorded,) = read_routes([project / f"results/routes/{name}/route.json"], 1.0)
        assert recorded["warning"] and f"[kdpipe] routing warning: {recorded['warning']}" in out
    said = {s: (project / f"results/logs/distill/{s}.log").read_text() for s in ("s_muki", "s_muki_no_mc")}
    for student, log in said.items():
        first = log.index("[kdpipe] routing warning: ")  # said first, before the student trains
        assert "epoch" not in log[:first].lower() and "epoch" in log[first:].lower(), student
