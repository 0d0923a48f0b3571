"""kdpipe against the tools users pick today, on the same work, in one run: a Hugging Face ``Trainer`` subclass and
torchdistill, both with the teachers run online, as their users set them up, and kdpipe from its cache, the cost
of making the cache counted.

Same data (BBC News as ``make run`` prepared it), the same two subset teachers (those ``make run`` fine-tuned), the
same student (MiniLM layers 0 and 5), the same settings JSON per student (the one kdpipe's ``distill`` job gets:
epochs, batch 16, lr 1e-4 with 10% warm-up and linear decay, weight decay 0.01, clipping 1.0, max_length 96, the
seed) and the same losses (kdpipe's loss functions, ``peer_online.py``). Scenarios:

- ``sweep``: P vanilla-KD students that differ only by seed (``--students 1 5 20``); P = 1 is one student;
- ``five``: the default experiment's five distilled students (vanilla KD, UHC, DFA, MUKI soft and hard), MUKI's
  certainty from M = ``--mc-samples`` dropout-on passes per teacher: online on every batch for the peers, as MUKI's
  own code runs it, and once into the cache for kdpipe (its ``mc_dropout.samples``). Online MUKI costs tens of
  teacher forwards per step; with ``--muki-steps K`` the peers' MUKI students train K steps only and their run is
  projected from the measured step time (marked as projected), and their certainties are compared row by row with
  kdpipe's cached ones instead of their test accuracy. ``--only NAME ...`` runs some of the five (with ``--tools``,
  one tool's student again); the cache is made only for what they need.

The tools take turns student by student, so that any load on the machine falls on all of them alike. Each command
runs under ``/usr/bin/time`` (wall time, peak resident memory). Test accuracy is computed alike for every student
(eval-mode argmax on the test split): the comparison is of cost, so the accuracies must agree within seed noise.

The peers run in environments of their own (they are not dependencies of kdpipe), both seeing kdpipe's ``.venv``
for transformers and kdpipe's loss functions. The Trainer needs ``accelerate``; torchdistill needs torchvision,
whose wheel needs torch 2.14.1 instead of kdpipe's 2.13.0. From ``benchmarks/``, after ``make setup``:

    python3 -m venv out/trainer-venv && out/trainer-venv/bin/pip install --no-deps "accelerate==1.*"
    python3 -m venv out/td-venv && out/td-venv/bin/pip install torch==2.14.1 torchvision==0.29.1 torchdistill==1.1.5
    for v in trainer-venv td-venv; do printf '%s\\n' "$PWD/.." "$PWD/../.venv/lib/python3.11/site-packages" \\
        > out/$v/lib/python3.11/site-packages/kdpipe-venv.pth; done

Then, after ``make run`` (the data and the teachers):

    ../.venv/bin/python peers.py sweep --students 1 5 20
    ../.venv/bin/python peers.py five --muki-steps 12

Prints a Markdown table per scenario and appends JSON records to benchmarks/out/peers.jsonl.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from collections import defaultdict
from datetime import date
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from bench_common import OUT, timed_command  # noqa: E402

SCHEMA = REPO / "kdpipe/config.schema.yaml"
FIVE = ("vkd", "uhc", "dfa", "muki", "muki_hard")
TOOLS = {
    "trainer": "HF Trainer, teachers online",
    "torchdistill": "torchdistill, teachers online",
    "kdpipe": "kdpipe, from its cache",
}


def plan_for(students: dict, epochs: int | None = None, mc_samples: int | None = None):
    """kdpipe's plan of config.yaml with ``students`` instead of its own (and their epochs and MUKI's M when
    given)."""
    from snakemake.utils import validate

    from kdpipe.plan import Plan

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["students"] = students
    config["evaluate"]["oracle"] = []
    if epochs:
        config["student_defaults"]["epochs"] = epochs
    if mc_samples:
        config["mc_dropout"]["samples"] = mc_samples
    validate(config, str(SCHEMA), set_default=True)
    return Plan(config, yaml.safe_load(SCHEMA.read_text()))


class Runner:
    """Runs every tool's commands under /usr/bin/time and keeps their wall times and peak memory."""

    def __init__(self, args, tmp: Path):
        self.args, self.tmp = args, tmp
        self.workdir = args.workdir.resolve()
        self.data = self.workdir / "results/data/bbc_news"
        self.signals = tmp / "signals"
        self.records: dict[str, dict] = defaultdict(lambda: {"cache_s": 0.0, "students": {}, "peak_mb": 0.0})

    def time(self, tool: str, cmd: list[str], name: str) -> float:
        wall, peak = timed_command(cmd, self.tmp / f"{tool}.{name}.log", self.args.threads)
        self.records[tool]["peak_mb"] = max(self.records[tool]["peak_mb"], peak)
        return wall

    def kdpipe(self, *command: str) -> list[str]:
        return [sys.executable, "-m", "kdpipe", "--threads", str(self.args.threads), *command]

    def make_cache(self, plan, students: list[str]) -> None:
        """kdpipe's cache for ``students``: every signal pass they and their routes read, as the workflow runs it at
        S = 1 (one ``signal-pass`` job per teacher, split and pass, writing its signals' files), then the routes."""
        from kdpipe.signals.catalog import SIGNALS, pass_of

        by_file = {spec.files[0]: name for name, spec in SIGNALS.items()}
        routes = {plan.student_route(s) for s in students} - {None}
        files = [Path(f) for s in students for f in plan.signal_files(s)]
        files += [Path(f) for route in routes for f in plan.route_inputs(route)]
        wanted = {(f.parts[-3], f.parts[-2], by_file[f.name]) for f in files if f.name in by_file}
        for teacher, split, which in sorted({(t, s, pass_of(n)) for t, s, n in wanted}):
            signals = [n for n in SIGNALS if (teacher, split, n) in wanted and pass_of(n) == which]  # catalog order
            cmd = ["signal-pass", "--params", json.dumps(plan.pass_params(teacher, split, signals))]
            cmd += ["--teacher", str(self.workdir / "results/teachers" / teacher), "--data", str(self.data)]
            cmd += ["--out", str(self.signals / teacher / split)]
            name = "+".join(signals)
            seconds = self.time("kdpipe", self.kdpipe(*cmd), f"{name}.{teacher}.{split}")
            self.records["kdpipe"]["cache_s"] += seconds
            print(f"  kdpipe cache: {name} of {teacher} on {split}: {seconds:.0f} s", flush=True)
        for route in sorted(routes):
            route_cmd = ["route", "--params", json.dumps(plan.route_params(route)), "--data", str(self.data)]
            route_cmd += ["--signals-root", str(self.signals), "--out", str(self.tmp / "routes" / route)]
            seconds = self.time("kdpipe", self.kdpipe(*route_cmd), f"route.{route}")
            self.records["kdpipe"]["cache_s"] += seconds
            print(f"  kdpipe route {route}: {seconds:.0f} s", flush=True)

    def student(self, tool: str, plan, name: str, max_steps: int = 0) -> None:
        """Train ``name`` with ``tool`` and score it on the test split."""
        params = json.dumps(plan.student_params(name))
        out = self.tmp / tool / name
        if tool == "kdpipe":
            route = plan.student_route(name)
            cmd = self.kdpipe(
                "distill",
                "--params",
                params,
                "--data",
                str(self.data),
                "--signals-root",
                str(self.signals),
                "--out",
                str(out),
                "--prototypes",
                "--route",
            )
            cmd += [str(self.tmp / "routes" / route)] if route else []
        else:
            python = self.args.trainer_python if tool == "trainer" else self.args.torchdistill_python
            script = HERE / ("peer_trainer.py" if tool == "trainer" else "peer_torchdistill.py")
            cmd = [python, str(script), "--params", params, "--workdir", str(self.workdir), "--out", str(out)]
            cmd += ["--threads", str(self.args.threads), "--mc-samples", str(self.args.mc_samples)]
            cmd += ["--max-steps", str(max_steps)] if max_steps else []
        wall = self.time(tool, cmd, name)
        entry = {"wall_s": wall, "accuracy": None if max_steps else test_accuracy(out, self.data)}
        timing = out / "timing.json"
        if max_steps and timing.exists():
            t = json.loads(timing.read_text())
            step_s = t["train_s"] / t["steps"]
            runs = t["epoch_steps"] * plan.student_params(name)["epochs"]
            entry.update(measured_steps=t["steps"], step_s=step_s, projected=True)
            entry["wall_s"] = wall - t["train_s"] + step_s * runs  # start-up as measured, training projected
        if (out / "certainty.npz").exists():
            entry["certainty"] = str(out / "certainty.npz")
        self.records[tool]["students"][name] = entry
        shown = "projected " if entry.get("projected") else ""
        accuracy = f", test accuracy {100 * entry['accuracy']:.1f}%" if entry["accuracy"] is not None else ""
        print(f"  {TOOLS[tool]}: {name}: {shown}{entry['wall_s']:.0f} s{accuracy}", flush=True)


def test_accuracy(model_dir: Path, data: Path) -> float:
    """Eval-mode accuracy on the test split, computed alike for every tool's students."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from kdpipe.data.dataset import read_split

    test = read_split(data, "test")
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    order = [model.config.id2label[i] for i in range(model.config.num_labels)]
    predicted = []
    with torch.inference_mode():
        for start in range(0, len(test), 64):
            texts = test["text"].iloc[start : start + 64].tolist()
            batch = tokenizer(texts, truncation=True, max_length=96, padding=True, return_tensors="pt")
            predicted += [order[i] for i in model(**batch).logits.argmax(-1).tolist()]
    return sum(p == g for p, g in zip(predicted, test["label"])) / len(test)


def certainty_check(runner: Runner, plan, tool: str, name: str) -> str:
    """MUKI's certainties of the rows a peer saw, computed online, against kdpipe's cached ones of those rows."""
    entry = runner.records[tool]["students"][name]
    if "certainty" not in entry:
        return "no certainties recorded"
    from kdpipe.data.dataset import read_split
    from kdpipe.routing.artifact import read_route

    online = np.load(entry["certainty"])
    rows = read_split(runner.data, "train")["row_id"].to_numpy()
    route = runner.tmp / "routes" / plan.student_route(name)
    scores, _ = read_route(route, "train", rows, plan.student_params(name)["teachers"])
    position = {r: i for i, r in enumerate(rows)}
    cached = scores[[position[r] for r in online["row_id"]]]
    u = online["certainty"]
    same = float((u.argmax(-1) == cached.argmax(-1)).mean())
    entry.update(certainty_rows=len(u), certainty_mad=float(np.abs(u - cached).mean()), same_teacher=same)
    return f"{len(u)} rows: mean |Δu| {entry['certainty_mad']:.3f}, same teacher chosen on {same:.1%}"


def sweep(args, runner: Runner) -> list[dict]:
    most = max(args.students)
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    plan = plan_for({"vkd": {**config["students"]["vkd"], "seeds": list(range(most))}}, args.epochs)
    names = list(plan.students)
    runner.make_cache(plan, names)
    for name in names:
        for tool in args.tools:
            runner.student(tool, plan, name)
    rows = []
    for p_students in sorted(args.students):
        for tool in args.tools:
            res = runner.records[tool]
            chosen = [res["students"][n] for n in names[:p_students]]
            accuracies = [e["accuracy"] for e in chosen]
            rows.append(
                {
                    "scenario": "sweep",
                    "tool": TOOLS[tool],
                    "students": p_students,
                    "wall_s": (res["cache_s"] if tool == "kdpipe" else 0) + sum(e["wall_s"] for e in chosen),
                    "cache_s": res["cache_s"] if tool == "kdpipe" else 0,
                    "peak_mb": res["peak_mb"],
                    "accuracy": accuracies,
                }
            )
    return rows


def five(args, runner: Runner) -> list[dict]:
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    plan = plan_for({name: config["students"][name] for name in FIVE}, args.epochs, args.mc_samples)
    names = args.only or list(FIVE)
    muki = [n for n in names if plan.student_params(n)["method"] == "muki"]
    if "kdpipe" in args.tools or muki:  # kdpipe's students, or the routes the peers' MUKI certainties are checked on
        runner.make_cache(plan, names if "kdpipe" in args.tools else muki)
    for name in names:
        muki = plan.student_params(name)["method"] == "muki"
        for tool in args.tools:
            runner.student(tool, plan, name, max_steps=args.muki_steps if muki and tool != "kdpipe" else 0)
    rows = []
    for tool in args.tools:
        res = runner.records[tool]
        for name in names:
            entry = res["students"][name]
            check = certainty_check(runner, plan, tool, name) if tool != "kdpipe" and entry.get("projected") else ""
            rows.append({"scenario": "five", "tool": TOOLS[tool], "student": name, **entry, "check": check})
        total = (res["cache_s"] if tool == "kdpipe" else 0) + sum(e["wall_s"] for e in res["students"].values())
        rows.append(
            {
                "scenario": "five",
                "tool": TOOLS[tool],
                "student": "all five" if len(names) == len(FIVE) else f"these {len(names)}",
                "wall_s": total,
                "cache_s": res["cache_s"] if tool == "kdpipe" else 0,
                "peak_mb": res["peak_mb"],
                "projected": any(e.get("projected") for e in res["students"].values()),
            }
        )
    return rows


def accuracy_check(rows: list[dict]) -> None:
    """The accuracy check of the sweep: each peer's students against kdpipe's (the same seeds), by Welch's t-test
    on the largest P: the tools train the same loss, so their means should differ by seed noise only."""
    from scipy.stats import ttest_ind

    most = max(r["students"] for r in rows)
    final = {r["tool"]: r["accuracy"] for r in rows if r["students"] == most}
    ours = final.get(TOOLS["kdpipe"])
    for tool, accuracy in final.items():
        if tool == TOOLS["kdpipe"] or ours is None or len(accuracy) < 2:
            continue
        test = ttest_ind(accuracy, ours, equal_var=False)
        print(
            f"accuracy, {tool} against kdpipe over {most} seeds: {100 * np.mean(accuracy):.1f} against "
            f"{100 * np.mean(ours):.1f}%, Welch's t = {test.statistic:.2f}, p = {test.pvalue:.2f}"
        )


def show(rows: list[dict]) -> None:
    for row in rows:
        acc = row.get("accuracy")
        if isinstance(acc, list):
            sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
            acc = f"{100 * statistics.mean(acc):.1f} ± {100 * sd:.1f}%"
        elif isinstance(acc, float):
            acc = f"{100 * acc:.1f}%"
        what = row.get("students", row.get("student"))
        mark = " (projected)" if row.get("projected") else ""
        print(
            f"| {row['tool']} | {what} | {row['wall_s']:.0f}{mark} | {row.get('cache_s', 0):.0f} "
            f"| {row.get('peak_mb', 0):,.0f} | {acc or '—'} | {row.get('check', '')} |"
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("scenario", choices=["sweep", "five"])
    p.add_argument("--workdir", type=Path, default=REPO, help="a workflow directory after `make run`")
    p.add_argument("--students", type=int, nargs="+", default=[1, 5, 20], help="sweep: P, the numbers of students")
    p.add_argument("--epochs", type=int, default=None, help="override the students' epochs (default: config.yaml's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--mc-samples", type=int, default=16, help="five: MUKI's dropout-on passes per teacher")
    p.add_argument("--muki-steps", type=int, default=0, help="five: the peers' MUKI students train this many steps")
    p.add_argument("--only", nargs="+", choices=FIVE, help="five: these students only (default: all five)")
    p.add_argument("--tools", nargs="+", default=list(TOOLS), choices=list(TOOLS))
    p.add_argument("--trainer-python", default=str(OUT / "trainer-venv/bin/python"))
    p.add_argument("--torchdistill-python", default=str(OUT / "td-venv/bin/python"))
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=OUT if OUT.exists() else None) as tmp:
        runner = Runner(args, Path(tmp))
        rows = sweep(args, runner) if args.scenario == "sweep" else five(args, runner)
        stamp = {"date": date.today().isoformat(), "machine": platform.node(), "threads": args.threads}
        OUT.mkdir(exist_ok=True)
        with open(OUT / "peers.jsonl", "a") as fh:
            for row in rows:
                fh.write(json.dumps({**stamp, **row}) + "\n")
    if args.scenario == "sweep":
        accuracy_check(rows)
    print("\n| tool | students | wall s (cache included) | of it the cache, s | peak MB | test accuracy | check |")
    print("| --- | --- | ---: | ---: | ---: | --- | --- |")
    show(rows)


if __name__ == "__main__":
    main()
