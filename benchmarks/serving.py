"""Serving the default run's models side by side: the teacher, the student, its ONNX fp32 and int8 versions, and the
same student in a transformers ``pipeline``, each answering BBC News test texts on the CPU.

The models are the default experiment's architectures: the teacher all-MiniLM-L6 (``builtin:minilm-l6``, 22.7M
parameters) as a 5-class classifier, and the 2-layer student initialised from its layers 0 and 5 (15.6M). Both are
trained here with kdpipe's training loop on the gold labels of BBC News' training split (the default config's
split: 1,487 / 212 / 425 rows, max_length 96, batch 16, lr 1e-4; ``--teacher-epochs``, ``--student-epochs``; 0
leaves a fresh head, whose accuracy means nothing) and saved as kdpipe saves a model. The student is then exported
(``kdpipe.models.export.export_onnx``) and quantised (``quantize_int8``), and the four kdpipe folders are evaluated
on the test split by the evaluate stage, the exported ones against the PyTorch student (agreement, paired interval
of the accuracy difference, the accuracy-drop flag).

Each model is profiled by ``kdpipe.models.serving.serving_profile`` in a process of its own (peak memory of that
model alone), with ``--threads`` threads: batch-1 latency over ``--texts`` test texts after 10 warm-up requests, a
request being tokenisation + forward + softmax; throughput at ``--batch-size``; peak resident memory; the weights on
disk. The pipeline (``pipeline("text-classification", model=<student folder>, truncation=True, top_k=None)``, all
class scores out) is timed the same way in its own process. ``--rounds`` rounds, the models in a rotated order each
round, so that load on the shared machine falls on all of them alike; the table gives, per model, the median over
rounds of each number.

    nice -n 5 ../.venv/bin/python serving.py                     # the default: 2 threads, 3 rounds, 200 texts
    nice -n 5 ../.venv/bin/python serving.py --threads 1

Prints a Markdown table and the goal check (int8 batch-1 at least 2x faster than the PyTorch student and 5x faster
than the teacher), and appends a JSON record to benchmarks/out/serving.jsonl.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
from bench_common import BBC, OUT, parser, record, setup  # noqa: E402

MAX_LENGTH = 96
WARMUP = 10
GOALS = {"student": 2.0, "teacher": 5.0}  # int8's batch-1 speed-up over these


def train(model, tokenizer, labels, data, folder: Path, kind: str, epochs: int, seed: int, device) -> None:
    """``model`` trained on the gold labels (kdpipe's loop: the epoch with the best validation accuracy kept) and
    saved as kdpipe saves a model (``epochs`` 0: saved as built)."""
    import torch.nn.functional as F

    from kdpipe.data.batching import encode_frame, model_inputs
    from kdpipe.data.dataset import read_split
    from kdpipe.training.loop import FitResult, TrainSettings, encoded_validator, fit, save_trained, state_on_cpu

    local = {c: i for i, c in enumerate(labels)}
    encoded = {}
    for split in ("train", "validation"):
        frame = read_split(data, split)
        ids = frame["label"].map(local).to_numpy()
        encoded[split] = encode_frame(tokenizer, frame, max_length=MAX_LENGTH, label_ids=ids)
    config = {"max_length": MAX_LENGTH, "epochs": epochs, "lr": 1e-4, "batch_size": 16, "seed": seed}
    manifest = {"kind": kind, "config": config, "labels": labels, "rows": {"train": len(encoded["train"])}}
    if kind == "student":
        manifest.update(method="supervised", teachers=[])
    if epochs:

        def loss(model, batch):  # (kdpipe's supervised objective, without label smoothing)
            ce = F.cross_entropy(model(**model_inputs(batch)).logits.float(), batch["labels"])
            return ce, {"ce": ce.item()}

        result = fit(
            model,
            train=encoded["train"],
            loss_fn=loss,
            validate=encoded_validator(encoded["validation"], batch_size=64, device=device),
            settings=TrainSettings(epochs=epochs, lr=1e-4, batch_size=16, seed=seed),
            device=device,
            desc=f"{kind} (gold labels)",
        )
    else:
        result = FitResult(best_state=state_on_cpu(model), best_metrics={}, best_epoch=0)
    save_trained(folder, model, tokenizer, labels, result, manifest)


def evaluate_all(folders: dict[str, Path], data: Path, root: Path) -> dict[str, dict]:
    """The test-split evaluation of every kdpipe folder, the exported ones against the PyTorch student."""
    from kdpipe.evaluation.settings import EvalSettings
    from kdpipe.stages import evaluate

    out = {}
    for name, folder in folders.items():
        reference = root / "eval" / "student" if name in ("onnx fp32", "onnx int8") else None
        model = name.replace(" ", "_")
        params = {"model": model, "base": model, "kind": "student", "method": None, "seed": 0, "splits": ["test"]}
        params = EvalSettings.from_params({**params, "batch_size": 64, "ece_bins": 15})
        target = root / "eval" / ("student" if name == "student" else name.replace(" ", "_"))
        [out[name]] = evaluate.run(
            params, folder, data, [target / "test.json"], [target / "test.predictions.parquet"], reference=reference
        )
    return out


def pipeline_worker(job_file: str, out_file: str) -> None:
    """The student folder in a transformers pipeline, timed as serving_profile times a folder (its own process)."""
    job = json.loads(Path(job_file).read_text())
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import numpy as np
    import torch
    from transformers import pipeline

    from kdpipe.models.serving import REQUEST, cpu_name, peak_rss_mb, rss_mb

    torch.set_num_threads(job["threads"])
    before = rss_mb()
    started = time.perf_counter()
    classify = pipeline("text-classification", model=job["folder"], truncation=True, top_k=None, device="cpu")
    load_s = time.perf_counter() - started
    texts, warmup = job["texts"], job["warmup"]
    for text in texts[:warmup]:
        classify(text)
    latencies, cpu = [], []
    for text in texts[warmup:]:
        start, start_cpu = time.perf_counter(), time.process_time()
        classify(text)
        latencies.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    ms = 1000 * np.asarray(latencies)
    classify(texts[: job["batch_size"]], batch_size=job["batch_size"])
    start = time.perf_counter()
    classify(texts, batch_size=job["batch_size"])
    seconds = time.perf_counter() - start
    peak = peak_rss_mb()
    folder = Path(job["folder"])
    profile = {
        "model": "pipeline",
        "format": "transformers pipeline",
        "precision": "fp32",
        "request": REQUEST,
        "latency_ms": {
            "batch_size": 1,
            "requests": len(ms),
            "warmup": warmup,
            "median": float(np.median(ms)),
            "p95": float(np.percentile(ms, 95)),
            "mean": float(ms.mean()),
            "cpu_median": float(np.median(1000 * np.asarray(cpu))),
        },
        "throughput": {"batch_size": job["batch_size"], "texts": len(texts), "texts_per_s": len(texts) / seconds},
        "memory": {"peak_rss_mb": peak, "rss_before_load_mb": before, "model_mb": peak - before},
        "size": {"weights_mb": (folder / "model.safetensors").stat().st_size / 1e6},
        "load_s": load_s,
        "threads": job["threads"],
        "device": f"CPU ({cpu_name()}), transformers pipeline",
    }
    Path(out_file).write_text(json.dumps(profile))


def profile_pipeline(folder: Path, texts: list[str], threads: int, batch_size: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"folder": str(folder), "texts": texts, "warmup": WARMUP, "threads": threads,
                                   "batch_size": batch_size}))  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
        done = subprocess.run([sys.executable, __file__, "--worker", str(job), str(out)], env=env, text=True,
                              capture_output=True)  # fmt: skip
        if done.returncode:
            sys.exit(f"the pipeline's process failed:\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def median_profile(rounds: list[dict]) -> dict:
    """Each number the table shows: its median over the rounds."""
    pick = {
        "median": lambda p: p["latency_ms"]["median"],
        "cpu_median": lambda p: p["latency_ms"]["cpu_median"],
        "p95": lambda p: p["latency_ms"]["p95"],
        "texts_per_s": lambda p: p["throughput"]["texts_per_s"],
        "peak_rss_mb": lambda p: p["memory"]["peak_rss_mb"],
        "model_mb": lambda p: p["memory"]["model_mb"],
    }
    out = {key: statistics.median(fn(p) for p in rounds) for key, fn in pick.items()}
    out["weights_mb"] = rounds[0]["size"]["weights_mb"]
    return out


def make_models(args, device) -> tuple[Path, dict[str, Path], dict]:
    """The data, the trained teacher and student (made once in ``--work``), the student's ONNX and int8 folders."""
    from kdpipe.data.dataset import read_labels, read_split
    from kdpipe.data.prepare import prepare
    from kdpipe.data.settings import DatasetSettings
    from kdpipe.models.export import export_onnx, quantize_int8
    from kdpipe.models.loading import load_classifier, load_tokenizer
    from kdpipe.models.settings import StudentModel
    from kdpipe.models.students import build_student

    work = args.work
    data = work / "data"
    if not (data / "manifest.json").is_file():
        prepare(DatasetSettings.of_section({**BBC, "name": "bbc_news"}), data)
    labels = read_labels(data)
    folders = {"teacher": work / "teacher", "student": work / "student"}
    made: dict = {"train_s": {}}
    if not (folders["teacher"] / "manifest.json").is_file():
        start = time.perf_counter()
        model = load_classifier("builtin:minilm-l6", labels, seed=0)
        train(model, load_tokenizer("builtin:minilm-l6"), labels, data, folders["teacher"], "teacher",
              args.teacher_epochs, seed=0, device=device)  # fmt: skip
        made["train_s"]["teacher"] = time.perf_counter() - start
    if not (folders["student"] / "manifest.json").is_file():
        start = time.perf_counter()
        spec = StudentModel.from_params({"init": {"from": "builtin:minilm-l6", "layers": [0, 5]}})
        model, tokenizer = build_student(spec, labels, seed=1)
        train(model, tokenizer, labels, data, folders["student"], "student", args.student_epochs, seed=1,
              device=device)  # fmt: skip
        made["train_s"]["student"] = time.perf_counter() - start
    check = read_split(data, "validation")["text"].head(16).tolist()
    start = time.perf_counter()
    made["export_check"] = export_onnx(folders["student"], work / "student.onnx", name="student",
                                       check_texts=check)["check"]  # fmt: skip
    made["export_s"] = time.perf_counter() - start
    start = time.perf_counter()
    made["int8_check"] = quantize_int8(work / "student.onnx", work / "student.int8", check_texts=check)["check"]
    made["quantise_s"] = time.perf_counter() - start
    folders.update({"onnx fp32": work / "student.onnx", "onnx int8": work / "student.int8"})
    return data, folders, made


def profile_all(args, folders: dict[str, Path], texts: list[str]) -> dict[str, list[dict]]:
    """Every model's profile in each round, the models in a rotated order from round to round."""
    from kdpipe.models.serving import profile_in_subprocess

    names = [*folders, "pipeline"]
    rounds: dict[str, list[dict]] = {name: [] for name in names}
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            if name == "pipeline":
                rounds[name].append(profile_pipeline(folders["student"], texts, args.threads, args.batch_size))
            else:
                rounds[name].append(
                    profile_in_subprocess(
                        folders[name], texts, name=name, batch_size=args.batch_size, warmup=WARMUP, threads=args.threads
                    )  # fmt: skip
                )
            print(f"round {r + 1}: {name} {rounds[name][-1]['latency_ms']['median']:.2f} ms", file=sys.stderr)
    return rounds


def print_table(args, table: dict, evaluations: dict, flag: dict, speedups: dict, per_round: dict) -> None:
    print(f"\n{args.threads} threads, {args.texts} BBC News test texts (max_length {MAX_LENGTH}), batch-1 after "
          f"{WARMUP} warm-up requests; throughput at batch {args.batch_size}; median over {args.rounds} "
          "rounds\n")  # fmt: skip
    print("| model | latency median (ms) | p95 (ms) | CPU per request, median (ms) | texts/s | peak RSS (MB) | "
          "of which model (MB) | weights (MB) | test accuracy | agreement with the student |")  # fmt: skip
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, row in table.items():
        ev = evaluations.get(name)
        accuracy = f"{100 * ev['metrics']['accuracy']:.1f}%" if ev else "(the student's)"
        agreement = f"{100 * ev['reference']['agreement']:.1f}%" if ev and "reference" in ev else "—"
        print(f"| {name} | {row['median']:.2f} | {row['p95']:.2f} | {row['cpu_median']:.2f} | "
              f"{row['texts_per_s']:.1f} | {row['peak_rss_mb']:.0f} | {row['model_mb']:.0f} | "
              f"{row['weights_mb']:.1f} | {accuracy} | {agreement} |")  # fmt: skip
    difference = evaluations["onnx int8"]["reference"]["accuracy_difference"]
    print(f"\nint8 - student accuracy: {100 * difference['difference']:+.1f} points (95% paired interval "
          f"{100 * difference['low']:+.1f} to {100 * difference['high']:+.1f}); flagged (> 1 point): "
          f"{flag['flagged']}")  # fmt: skip
    for ref, goal in GOALS.items():
        verdict = "met" if speedups[ref] >= goal else "NOT met"
        rounds = ", ".join(f"{x:.2f}x" for x in per_round[ref])
        cpu = table[ref]["cpu_median"] / table["onnx int8"]["cpu_median"]
        print(f"int8 batch-1 speed-up over the {ref}: {speedups[ref]:.2f}x (goal {goal:g}x: {verdict}; round by "
              f"round {rounds}; in CPU time per request {cpu:.2f}x)")  # fmt: skip


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--texts", type=int, default=200, help="test texts profiled (after 10 warm-up requests)")
    p.add_argument("--batch-size", type=int, default=32, help="batch size of the throughput pass")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--teacher-epochs", type=int, default=1)
    p.add_argument("--student-epochs", type=int, default=2)
    p.add_argument("--work", type=Path, default=OUT / "serving", help="where the models are made (kept for reruns)")
    args = p.parse_args()
    device = setup(args)

    from kdpipe.data.dataset import read_split
    from kdpipe.evaluation.exported import accuracy_drop

    data, folders, made = make_models(args, device)
    evaluations = evaluate_all(folders, data, args.work)
    flag = accuracy_drop(evaluations["student"], evaluations["onnx int8"])
    rounds = profile_all(args, folders, read_split(data, "test")["text"].tolist()[: args.texts + WARMUP])
    table = {name: median_profile(profiles) for name, profiles in rounds.items()}
    speedups = {ref: table[ref]["median"] / table["onnx int8"]["median"] for ref in GOALS}
    per_round = {
        ref: [a["latency_ms"]["median"] / b["latency_ms"]["median"] for a, b in zip(rounds[ref], rounds["onnx int8"])]
        for ref in GOALS
    }
    print_table(args, table, evaluations, flag, speedups, per_round)
    rec = record(
        "serving",
        device,
        command=" ".join(sys.argv),
        texts=args.texts,
        batch_size=args.batch_size,
        epochs={"teacher": args.teacher_epochs, "student": args.student_epochs},
        **made,
        rounds=rounds,
        table=table,
        speedups=speedups,
        speedups_per_round=per_round,
        evaluations={
            n: {"accuracy": e["metrics"]["accuracy"], "ece": e["metrics"]["ece"], "reference": e.get("reference")}
            for n, e in evaluations.items()
        },  # fmt: skip
        flag=flag,
    )
    print(f"\nrecorded in {OUT / 'serving.jsonl'} ({rec['date']}, {rec['machine']})")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        pipeline_worker(sys.argv[2], sys.argv[3])
    else:
        main()
