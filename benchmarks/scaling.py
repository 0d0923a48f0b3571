"""How cost grows with the work: wall time and peak memory of the teacher-side passes and of a student epoch
against the number of training rows N, and of MC-dropout against the number of samples T.

Each step is the workflow's own command (`python -m kdpipe signal-pass`, `python -m kdpipe
distill`), run under `/usr/bin/time` for its wall time and peak resident memory, with the job settings the plan
(`kdpipe.plan.Plan`) makes from config.yaml. The training split is BBC News' training rows repeated to N rows
(deduplication off; validation and test splits unchanged), so only N changes. One MiniLM teacher on all five
classes is fine-tuned once, on the smallest N, and reused for every N. Steps:
- `logits`, `hidden` (the hidden states of the layers a DFA student reads) and `mc` (MC-dropout, T samples): one
  pass each over the N training rows;
- `student epoch`: a vanilla-KD student (2 MiniLM layers) trained for 1 epoch from those cached logits, its
  validation included.
Time should grow linearly in N and T, and memory stay flat in N (the signals are written and read row by row).
Memory is the peak resident set (``/usr/bin/time``; it counts pages of memory-mapped files the step touched) and the
peak anonymous memory (its heap, sampled from /proc). Prints a Markdown
table with seconds per 1,000 rows, writes a plot (`--plot`) and appends JSON records to
benchmarks/out/scaling.jsonl.

    python scaling.py                                   # N = 1k, 4k, 16k, 64k; T = 4, 8, 16 at the smallest N
    python scaling.py --rows 1000 2000 4000 --samples 4 8 --max-length 64     # a shorter run

With ``--backbone`` (e.g. ``builtin:tiny-bert``) it times every step of one run at each N instead, teacher
included: ``prepare``, ``teacher`` (fine-tuning, 1 epoch), ``logits``, ``mc`` (T = 4), ``student epoch`` (vanilla
KD from the logits, a student of the same backbone) and ``evaluate`` (the student on the N training rows). Texts are
BBC articles cut to ``--text-chars`` characters (at max_length 32 the rest is truncated anyway), so that only N
changes. Per step it records the wall time, the stage's own time (from its ``[kdpipe]`` summary line, without the
process start-up), the peak resident and anonymous memory and, for a signal, the bytes per row it wrote to disk:

    python scaling.py --backbone builtin:tiny-bert --max-length 32 --batch-size 256 --rows 10000 100000 1000000

(``--batch-size``: the teacher's and the student's, else config.yaml's; at 16 a tiny model's steps are mostly
per-step overhead.)
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
from datetime import date
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import yaml

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench_common import timed_command  # noqa: E402

from kdpipe.data.dataset import read_split  # noqa: E402
from kdpipe.data.prepare import prepare  # noqa: E402
from kdpipe.data.settings import DatasetSettings  # noqa: E402
from kdpipe.plan import Plan  # noqa: E402

OUT = Path(__file__).parent / "out"
SCHEMA = REPO / "kdpipe/config.schema.yaml"


def plan_for(files: dict, samples: int, max_length: int, threads: int) -> Plan:
    """The plan of config.yaml with the given data files, one teacher on all classes and two students: a DFA
    student (so that the hidden-state dump has layers to keep) and the vanilla-KD student that is timed."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["dataset"] = {"name": "scaling", "files": files, "dedup": False}
    config["teachers"] = {"teacher": {"epochs": 1, "max_length": max_length}}
    config["mc_dropout"] = {"samples": samples, "splits": ["train"]}
    config["students"] = {
        "vkd": {"method": "vanilla_kd", "epochs": 1, "max_length": max_length},
        "dfa": {"method": "dfa", "max_length": max_length},
    }
    config["evaluate"]["oracle"] = []
    validate(config, str(SCHEMA), set_default=True)
    return Plan(config, yaml.safe_load(SCHEMA.read_text()))


def timed(args: list[str], threads: int, log: Path) -> tuple[float, float, float]:
    """Wall seconds, peak resident MB and peak anonymous MB of ``python -m kdpipe ARGS``."""
    anon = {}
    wall, rss = timed_command([sys.executable, "-m", "kdpipe", "--threads", str(threads), *args], log, threads, anon)
    return wall, rss, anon["mb"]


def signal_pass(plan: Plan, signal: str, teacher: Path, data: Path, root: Path, threads: int):
    """One unsharded pass of ``signal`` over the training split into ``root``, as the workflow runs it at S = 1 (one
    ``signal-pass`` job writing the signal's files): wall seconds, peak resident and peak anonymous MB."""
    params = json.dumps(plan.pass_params("teacher", "train", [signal]))
    root.mkdir(parents=True, exist_ok=True)
    cmd = ["signal-pass", "--params", params, "--teacher", str(teacher), "--data", str(data)]
    return timed(cmd + ["--out", str(root / "teacher" / "train")], threads, root / f"{signal}.log")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1000, 4000, 16000, 64000])
    p.add_argument("--samples", type=int, nargs="+", default=[4, 8, 16], help="T for MC-dropout at the smallest N")
    p.add_argument("--max-length", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--plot", type=Path, default=Path(__file__).parent / "scaling.png")
    p.add_argument("--backbone", default=None, help="time every step of a run on this backbone, e.g. builtin:tiny-bert")
    p.add_argument("--text-chars", type=int, default=200, help="with --backbone: each text cut to this many characters")
    p.add_argument("--keep", type=Path, default=None, help="with --backbone: work in this folder and keep it")
    p.add_argument("--batch-size", type=int, default=None, help="with --backbone: teacher and student batch size")
    args = p.parse_args()
    if args.backbone:
        steps_main(args)
        return
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        prepare(
            DatasetSettings.of_section(
                {"name": "bbc", "source": "builtin:bbc_news", "split": {"validation": 0.1, "test": 0.2, "seed": 13}}
            ),
            tmp / "bbc",
        )
        splits = {s: read_split(tmp / "bbc", s)[["text", "label"]] for s in ("train", "validation", "test")}
        for s in ("validation", "test"):
            splits[s].to_csv(tmp / f"{s}.csv", index=False)
        teacher = tmp / "teacher"
        for n in sorted(args.rows):
            work = tmp / f"n{n}"
            work.mkdir()
            train = splits["train"].sample(n=n, replace=n > len(splits["train"]), random_state=0)
            train.to_csv(work / "train.csv", index=False)
            files = {"train": str(work / "train.csv"), **{s: str(tmp / f"{s}.csv") for s in ("validation", "test")}}
            samples = args.samples if n == min(args.rows) else args.samples[:1]
            plan = plan_for(files, samples[0], args.max_length, args.threads)
            data = work / "data"
            prepare(DatasetSettings.from_params(plan.prepare_params()), data)
            if not teacher.exists():  # fine-tuned once, on the smallest N
                params = json.dumps(plan.teacher_params("teacher"))
                timed(
                    ["finetune-teacher", "--params", params, "--data", str(data), "--out", str(teacher)],
                    args.threads,
                    tmp / "teacher.log",
                )
            root = work / "signals"
            steps = [("logits", 0), ("hidden", 0)] + [("mc", t) for t in samples]
            for signal, t in steps:
                step_plan = plan_for(files, t, args.max_length, args.threads) if t else plan
                into = root if t in (0, samples[0]) else work / f"signals-T{t}"  # one mc artifact per folder
                wall, rss, anon = signal_pass(step_plan, signal, teacher, data, into, args.threads)
                records.append(
                    {
                        "step": signal if not t else f"mc (T = {t})",
                        "rows": n,
                        "samples": t or None,
                        "wall_s": wall,
                        "peak_mb": rss,
                        "anon_mb": anon,
                    }
                )
                print(records[-1], flush=True)
            params = json.dumps(plan.student_params("vkd"))
            wall, rss, anon = timed(
                [
                    "distill",
                    "--params",
                    params,
                    "--data",
                    str(data),
                    "--signals-root",
                    str(root),
                    "--out",
                    str(work / "student"),
                    "--prototypes",
                    "--route",
                ],
                args.threads,
                work / "distill.log",
            )
            records.append(
                {"step": "student epoch", "rows": n, "samples": None, "wall_s": wall, "peak_mb": rss, "anon_mb": anon}
            )
            print(records[-1], flush=True)
    report(records, args)


def append_records(frame: pd.DataFrame, args, **settings) -> dict:
    """Append each record, stamped with the date, machine and settings, to benchmarks/out/scaling.jsonl; return the
    stamp."""
    OUT.mkdir(exist_ok=True)
    stamp = {
        "date": date.today().isoformat(),
        "machine": platform.node(),
        "threads": args.threads,
        "max_length": args.max_length,
        **settings,
    }
    with open(OUT / "scaling.jsonl", "a") as fh:
        for rec in frame.to_dict("records"):
            fh.write(json.dumps({**stamp, **rec}) + "\n")
    return stamp


def report(records: list[dict], args) -> None:
    frame = pd.DataFrame(records)
    frame["s_per_1k"] = frame["wall_s"] / frame["rows"] * 1000
    stamp = append_records(frame, args)
    print(f"\n{stamp['date']}, {args.threads} threads, max_length {args.max_length}\n")
    print("| step | rows | wall s | s per 1k rows | peak RSS MB | peak anonymous MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for rec in frame.to_dict("records"):
        print(
            f"| {rec['step']} | {rec['rows']:,} | {rec['wall_s']:.1f} | {rec['s_per_1k']:.1f} | {rec['peak_mb']:.0f} "
            f"| {rec['anon_mb']:.0f} |"
        )
    # A straight line wall = fixed + per_row * N per step: the fixed part is the process start-up (imports, the model
    # load), the slope the cost that grows with N; the worst residual says how far from linear the step is.
    print(
        "\n| step | fixed s | s per 1k rows | worst deviation from the line | peak RSS MB, smallest to largest N "
        "| peak anonymous MB |"
    )
    print("| --- | ---: | ---: | ---: | --- | --- |")
    for step, rows in frame.groupby("step", sort=False):
        if len(rows) < 2:
            continue
        slope, fixed = np.polyfit(rows["rows"], rows["wall_s"], 1)
        worst = float((rows["wall_s"] - (fixed + slope * rows["rows"])).abs().div(rows["wall_s"]).max())
        peaks = " → ".join(f"{m:.0f}" for m in rows["peak_mb"])
        anon = " → ".join(f"{m:.0f}" for m in rows["anon_mb"])
        print(f"| {step} | {fixed:.1f} | {1000 * slope:.1f} | {100 * worst:.1f}% | {peaks} | {anon} |")
    mc = frame[frame["samples"].notna() & (frame["rows"] == frame["rows"].min())]
    if len(mc) >= 2:  # MC-dropout against T at the smallest N
        slope, fixed = np.polyfit(mc["samples"], mc["wall_s"], 1)
        worst = float((mc["wall_s"] - (fixed + slope * mc["samples"])).abs().div(mc["wall_s"]).max())
        samples = ", ".join(str(int(t)) for t in mc["samples"])
        print(
            f"\nMC-dropout at N = {mc['rows'].iloc[0]:,}: {fixed:.1f} s fixed + {slope:.1f} s per sample T "
            f"(T = {samples}; worst deviation from the line {100 * worst:.1f}%)"
        )
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5))
    for i, (step, rows) in enumerate(
        frame[frame["samples"].isna() | (frame["samples"] == min(args.samples))].groupby("step")
    ):
        ax_t.plot(rows["rows"], rows["wall_s"], marker="o", label=step, color=f"C{i}")
        ax_m.plot(rows["rows"], rows["peak_mb"], marker="o", color=f"C{i}", label=f"{step}: resident")
        ax_m.plot(rows["rows"], rows["anon_mb"], marker="x", linestyle="--", color=f"C{i}", label=f"{step}: heap")
    ax_t.set(xscale="log", yscale="log", xlabel="training rows N", ylabel="wall time (s)", title="Time against N")
    ax_m.set(xscale="log", xlabel="training rows N", ylabel="peak memory (MB)",
             title="Memory against N (resident; heap = anonymous)")  # fmt: skip
    ax_m.legend(fontsize=7, ncol=2)
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    # Plain numbers (1,000 rather than 10^3) on the log axes: N ticked where it was measured, time at 1, 2, 5 x 10^k
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}")
    ax_t.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))
    for ax in (ax_t, ax_m):
        ax.set_xticks(sorted(frame["rows"].unique()))
    for axis in (ax_t.xaxis, ax_t.yaxis, ax_m.xaxis):
        axis.set_major_formatter(plain)
        axis.set_minor_formatter(NullFormatter())
    ax_m.set_ylim(bottom=0)
    ax_t.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.plot, dpi=100)
    print(f"\nplot: {args.plot}")


# ---- every step of one run on a given backbone (--backbone) ------------------------------------------------------

# The stage's own seconds in its summary line (kdpipe.core.progress.summary_line), without the process start-up
STAGE_SECONDS = re.compile(r"^\[kdpipe\] .* in ([0-9.]+) s\b", re.MULTILINE)


def steps_plan(files: dict, args) -> Plan:
    """config.yaml with the given data files, one teacher (1 epoch) and one vanilla-KD student (1 epoch) on
    ``args.backbone``, MC-dropout with T = 4 on the training split."""
    from snakemake.utils import validate

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["dataset"] = {"name": "scaling", "files": files, "dedup": False}
    config["teacher_defaults"] = {**config["teacher_defaults"], "backbone": args.backbone}
    batch = {"batch_size": args.batch_size} if args.batch_size else {}
    config["teachers"] = {"teacher": {"epochs": 1, "max_length": args.max_length, **batch}}
    config["mc_dropout"] = {"samples": 4, "splits": ["train"]}
    config["students"] = {
        "vkd": {
            "method": "vanilla_kd",
            "epochs": 1,
            "max_length": args.max_length,
            "model": {"init": {"from": args.backbone}},
            **batch,
        }
    }
    config["evaluate"]["oracle"] = []
    validate(config, str(SCHEMA), set_default=True)
    return Plan(config, yaml.safe_load(SCHEMA.read_text()))


def folder_bytes(*paths: Path) -> int:
    return sum(f.stat().st_size for p in paths for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())


def steps_main(args) -> None:
    """Every step of a run at each N: wall time, the stage's own time, peak memory and the bytes written per row."""
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.keep or Path(tmp)
        tmp.mkdir(parents=True, exist_ok=True)
        prepare(
            DatasetSettings.of_section(
                {"name": "bbc", "source": "builtin:bbc_news", "split": {"validation": 0.1, "test": 0.2, "seed": 13}}
            ),
            tmp / "bbc",
        )
        splits = {s: read_split(tmp / "bbc", s)[["text", "label"]] for s in ("train", "validation", "test")}
        for frame in splits.values():
            frame["text"] = frame["text"].str.slice(0, args.text_chars)
        for s in ("validation", "test"):
            splits[s].to_csv(tmp / f"{s}.csv", index=False)
        for n in sorted(args.rows):
            work = tmp / f"n{n}"
            work.mkdir(exist_ok=True)
            train = splits["train"].sample(n=n, replace=n > len(splits["train"]), random_state=0)
            train.to_csv(work / "train.csv", index=False)
            del train
            files = {"train": str(work / "train.csv"), **{s: str(tmp / f"{s}.csv") for s in ("validation", "test")}}
            plan = steps_plan(files, args)
            data, teacher, signals, student = work / "data", work / "teacher", work / "signals", work / "student"
            evaluation = work / "evaluate"
            evaluation.mkdir(exist_ok=True)

            def step(name: str, command: list[str], written: list[Path] = (), n=n, work=work):
                log = work / f"{name.replace(' ', '_')}.log"
                anon = {}
                cmd = [sys.executable, "-m", "kdpipe", "--threads", str(args.threads), *command]
                wall, rss = timed_command(cmd, log, args.threads, anon)
                found = STAGE_SECONDS.findall(log.read_text())
                rec = {
                    "step": name,
                    "rows": n,
                    "wall_s": wall,
                    "stage_s": float(found[-1]) if found else None,
                    "peak_mb": rss,
                    "anon_mb": anon["mb"],
                    "disk_bytes_per_row": folder_bytes(*written) / n if written else None,
                    "log_bytes": log.stat().st_size,
                }
                records.append(rec)
                print(rec, flush=True)

            step("prepare", ["prepare", "--params", json.dumps(plan.prepare_params()), "--out", str(data)])
            step(
                "teacher",
                ["finetune-teacher", "--params", json.dumps(plan.teacher_params("teacher")), "--data", str(data),
                 "--out", str(teacher), "--prototypes"],
            )  # fmt: skip
            for signal in ("logits", "mc"):
                params = json.dumps(plan.signal_params("teacher", "train", signal))
                part, out = work / "parts" / signal, signals / "teacher" / "train"
                step(
                    f"{signal} shard",
                    ["signal-shard", "--params", params, "--teacher", str(teacher), "--data", str(data),
                     "--shard", "1-of-1", "--out-part", str(part)],
                )  # fmt: skip
                before = {p.name for p in out.glob("*")} if out.exists() else set()
                step(f"{signal} gather", ["signal-gather", "--params", params, "--parts", str(part), "--out", str(out)])
                files_written = [p for p in out.glob("*") if p.name not in before and p.suffix != ".json"]
                records[-1]["disk_bytes_per_row"] = folder_bytes(*files_written) / n
                records[-1]["files"] = sorted(p.name for p in files_written)
            step(
                "student epoch",
                ["distill", "--params", json.dumps(plan.student_params("vkd")), "--data", str(data),
                 "--signals-root", str(signals), "--out", str(student), "--prototypes", "--route"],
            )  # fmt: skip
            step(
                "evaluate",
                ["evaluate", "--params", json.dumps(plan.eval_params("vkd", ["train"])), "--model", str(student),
                 "--data", str(data), "--out-json", str(evaluation / "train.json"),
                 "--out-predictions", str(evaluation / "train.predictions.parquet")],
                [evaluation / "train.predictions.parquet"],
            )  # fmt: skip
    steps_report(records, args)


def steps_report(records: list[dict], args) -> None:
    frame = pd.DataFrame(records)
    stamp = append_records(frame, args, backbone=args.backbone, text_chars=args.text_chars, batch_size=args.batch_size)
    print(f"\n{stamp['date']}, {args.backbone}, {args.threads} threads, max_length {args.max_length}\n")
    print("| step | rows | wall s | stage s | µs per row (wall) | µs per row (stage) | peak RSS MB | peak anonymous MB "
          "| disk bytes per row |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for rec in frame.to_dict("records"):
        stage, disk, n = rec["stage_s"], rec["disk_bytes_per_row"], rec["rows"]
        stage_cells = ("", "") if pd.isna(stage) else (f"{stage:.1f}", f"{1e6 * stage / n:.0f}")
        disk = "" if pd.isna(disk) else f"{disk:.1f}"
        print(
            f"| {rec['step']} | {n:,} | {rec['wall_s']:.1f} | {stage_cells[0]} | {1e6 * rec['wall_s'] / n:.0f} | "
            f"{stage_cells[1]} | {rec['peak_mb']:.0f} | {rec['anon_mb']:.0f} | {disk} |"
        )
    if frame["rows"].nunique() < 2:
        return
    print("\n| step | µs per row (stage), smallest to largest N | change | peak RSS MB | growth per row (bytes) |")
    print("| --- | --- | ---: | --- | ---: |")
    for step, rows in frame.groupby("step", sort=False):
        rows = rows.sort_values("rows")
        seconds = rows["stage_s"].fillna(rows["wall_s"])
        per_row = 1e6 * seconds / rows["rows"]
        change = per_row.iloc[-1] / per_row.iloc[0] - 1
        growth = np.diff(rows["peak_mb"].iloc[[0, -1]])[0] * 2**20 / np.diff(rows["rows"].iloc[[0, -1]])[0]
        print(
            f"| {step} | {' → '.join(f'{v:.0f}' for v in per_row)} | {100 * change:+.0f}% | "
            f"{' → '.join(f'{m:.0f}' for m in rows['peak_mb'])} | {growth:.0f} |"
        )


if __name__ == "__main__":
    main()
