"""kdpipe against the recipe most users copy: a Hugging Face `Trainer` subclass that runs the teachers online.

Side by side in one run, on the same data, teachers, student architecture and settings (BBC News as prepared by
the default workflow, its two subset teachers, a 2-layer student initialised from MiniLM layers 0 and 5, vanilla KD
at T = 5 on the concatenated teacher logits without gold labels, batch 16, lr 1e-4 with 10% warm-up and linear
decay, weight decay 0.01, clipping at 1.0, max_length 96, the best validation epoch kept), P students that differ
only by seed:

- **HF Trainer**: `Trainer.compute_loss` runs both teachers (eval mode, no gradient) on every batch and takes the
  KD loss against them, as in the transformers documentation's distillation recipes; one process per student.
- **kdpipe**: the workflow's own commands, `python -m kdpipe signal-shard` + `signal-gather` once per teacher (the
  cache, counted) and `python -m kdpipe distill` once per student, with the settings the plan makes from
  config.yaml.

Each command runs under `/usr/bin/time` (wall time, peak resident memory). Test accuracy of every student is
computed the same way for both (eval-mode argmax on the test split): the comparison is of cost, not of losses, so
the two tools' accuracies must agree within seed noise. Needs a finished default run (`make run`) for the data and
the teachers (`--workdir`).

    python peers.py --workdir .. --peer-python peers-venv/bin/python --students 1 5 --epochs 3
    python peers.py --workdir .. --peer-python peers-venv/bin/python --students 1 2 --epochs 1   # a shorter run

The `Trainer` needs `accelerate`, which kdpipe does not: it runs in an environment of its own, here one that sees
kdpipe's `.venv` and adds only accelerate:

    python -m venv peers-venv
    echo "$PWD/../.venv/lib/python3.11/site-packages" > peers-venv/lib/python3.11/site-packages/kdpipe-venv.pth
    peers-venv/bin/pip install --no-deps "accelerate>=1.1"

Prints a Markdown table and appends JSON records to benchmarks/out/peers.jsonl.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from datetime import date
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench_common import timed_command  # noqa: E402

OUT = Path(__file__).parent / "out"
SCHEMA = REPO / "workflow/schemas/config.schema.yaml"
TEACHERS = ("minilm_a", "minilm_b")


def plan_for(students: int, epochs: int):
    from snakemake.utils import validate

    from kdpipe.plan import Plan

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["students"] = {"vkd": {"method": "vanilla_kd", "epochs": epochs, "seeds": list(range(students))}}
    config["evaluate"]["oracle"] = []
    validate(config, str(SCHEMA), set_default=True)
    return Plan(config, yaml.safe_load(SCHEMA.read_text()))


def kdpipe_side(workdir: Path, tmp: Path, students: int, epochs: int, threads: int) -> dict:
    plan = plan_for(students, epochs)
    data, root = workdir / "results/data/bbc_news", tmp / "signals"
    kd = [sys.executable, "-m", "kdpipe", "--threads", str(threads)]
    cache_s, peak = 0.0, 0.0
    for t in TEACHERS:
        params = json.dumps(plan.signal_params(t, "train", "logits"))
        part = tmp / "parts" / t
        shard = kd + ["signal-shard", "--params", params, "--teacher", str(workdir / "results/teachers" / t)]
        wall, rss = timed_command(
            shard + ["--data", str(data), "--shard", "1-of-1", "--out-part", str(part)], tmp / f"{t}.log", threads
        )
        gather = kd + ["signal-gather", "--params", params, "--parts", str(part), "--out", str(root / t / "train")]
        wall2, rss2 = timed_command(gather, tmp / f"{t}.gather.log", threads)
        cache_s, peak = cache_s + wall + wall2, max(peak, rss, rss2)
    walls, accuracies = [], []
    for seed in range(students):
        name = f"vkd.seed{seed}" if students > 1 else "vkd"
        name = name if name in plan.students else next(n for n in plan.students if n.endswith(f"seed{seed}"))
        out = tmp / "students" / name
        params = json.dumps(plan.student_params(name))
        cmd = kd + ["distill", "--params", params, "--data", str(data), "--signals-root", str(root), "--out", str(out)]
        wall, rss = timed_command(cmd + ["--prototypes", "--route"], tmp / f"{name}.log", threads)
        walls.append(wall)
        peak = max(peak, rss)
        accuracies.append(test_accuracy(out, data))
    return {"cache_s": cache_s, "student_s": walls, "peak_mb": peak, "accuracy": accuracies}


def trainer_side(workdir: Path, tmp: Path, students: int, epochs: int, threads: int, python: str) -> dict:
    walls, peak, accuracies = [], 0.0, []
    for seed in range(students):
        out = tmp / f"trainer{seed}"
        cmd = [python, __file__, "trainer-job", "--workdir", str(workdir), "--out", str(out)]
        cmd += ["--seed", str(seed), "--epochs", str(epochs), "--threads", str(threads)]
        wall, rss = timed_command(cmd, tmp / f"trainer{seed}.log", threads)
        walls.append(wall)
        peak = max(peak, rss)
        accuracies.append(test_accuracy(out, workdir / "results/data/bbc_news"))
    return {"cache_s": 0.0, "student_s": walls, "peak_mb": peak, "accuracy": accuracies}


def test_accuracy(model_dir: Path, data: Path) -> float:
    """Eval-mode accuracy on the test split, computed alike for both tools' students."""
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


def trainer_job(args) -> None:
    """One student with the HF Trainer, the teachers run online in ``compute_loss``."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        DataCollatorWithPadding,
        Trainer,
        TrainingArguments,
    )

    from kdpipe.data.dataset import read_labels, read_split
    from kdpipe.models.loading import minilm_dir

    torch.set_num_threads(args.threads)
    data = args.workdir / "results/data/bbc_news"
    labels = read_labels(data)
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())

    def encode(split):
        frame = read_split(data, split)
        enc = tokenizer(frame["text"].tolist(), truncation=True, max_length=96)
        ids = frame["label_id"].astype(int).tolist()  # ids in the dataset's label order (labels.json)
        return [
            {"input_ids": i, "attention_mask": m, "labels": y}
            for i, m, y in zip(enc["input_ids"], enc["attention_mask"], ids)
        ]

    teachers, columns = [], []
    for t in TEACHERS:
        model = AutoModelForSequenceClassification.from_pretrained(args.workdir / "results/teachers" / t).eval()
        teachers.append(model)
        columns.append([labels.index(model.config.id2label[i]) for i in range(model.config.num_labels)])

    student = AutoModelForSequenceClassification.from_pretrained(
        minilm_dir(),
        num_labels=len(labels),
        id2label=dict(enumerate(labels)),
        label2id={c: i for i, c in enumerate(labels)},
    )
    student.bert.encoder.layer = torch.nn.ModuleList([student.bert.encoder.layer[i] for i in (0, 5)])
    student.config.num_hidden_layers = 2

    class KDTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            inputs = dict(inputs)
            inputs.pop("labels")
            outputs = model(**inputs)
            with torch.no_grad():
                target = torch.empty_like(outputs.logits)
                for teacher, cols in zip(teachers, columns):
                    target[:, cols] = teacher(**inputs).logits
            temperature = 5.0
            loss = (
                F.kl_div(
                    F.log_softmax(outputs.logits / temperature, -1),
                    F.softmax(target / temperature, -1),
                    reduction="batchmean",
                )
                * temperature**2
            )
            return (loss, outputs) if return_outputs else loss

    def accuracy(pred):
        return {"accuracy": float((np.argmax(pred.predictions, -1) == pred.label_ids).mean())}

    training = TrainingArguments(
        output_dir=str(args.out) + ".checkpoints",
        num_train_epochs=args.epochs,
        per_device_train_batch_size=16,
        per_device_eval_batch_size=64,
        learning_rate=1e-4,
        warmup_steps=0.1,  # a float below 1: a share of the steps (transformers 5)
        weight_decay=0.01,
        max_grad_norm=1.0,
        lr_scheduler_type="linear",
        seed=args.seed,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="accuracy",
        save_total_limit=1,
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    for teacher in teachers:
        teacher.to(training.device)
    trainer = KDTrainer(
        model=student,
        args=training,
        train_dataset=encode("train"),
        eval_dataset=encode("validation"),
        data_collator=DataCollatorWithPadding(tokenizer),
        compute_metrics=accuracy,
    )
    trainer.train()
    trainer.save_model(str(args.out))
    tokenizer.save_pretrained(str(args.out))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "trainer-job":
        p = argparse.ArgumentParser()
        p.add_argument("trainer_job")
        for flag in ("--workdir", "--out"):
            p.add_argument(flag, type=Path, required=True)
        for flag in ("--seed", "--epochs", "--threads"):
            p.add_argument(flag, type=int, required=True)
        trainer_job(p.parse_args())
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, default=REPO, help="a workflow directory after `make run`")
    p.add_argument("--students", type=int, nargs="+", default=[1, 5], help="P, the numbers of students to compare")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peer-python", default=sys.executable, help="the Python of the Trainer's environment (accelerate)")
    args = p.parse_args()
    workdir = args.workdir.resolve()
    most = max(args.students)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "kdpipe").mkdir()
        (tmp / "trainer").mkdir()
        tools = {
            "HF Trainer, teachers online": trainer_side(
                workdir, tmp / "trainer", most, args.epochs, args.threads, args.peer_python
            ),
            "kdpipe, from its cache": kdpipe_side(workdir, tmp / "kdpipe", most, args.epochs, args.threads),
        }
    OUT.mkdir(exist_ok=True)
    stamp = {
        "date": date.today().isoformat(),
        "machine": platform.node(),
        "threads": args.threads,
        "epochs": args.epochs,
    }
    print("| date | tool | P | wall s (cache included) | peak MB | test accuracy, mean ± sd over the P students |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for p_students in sorted(args.students):
        for tool, res in tools.items():
            wall = res["cache_s"] + sum(res["student_s"][:p_students])
            acc = res["accuracy"][:p_students]
            sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
            rec = {
                **stamp,
                "tool": tool,
                "students": p_students,
                "wall_s": wall,
                "peak_mb": res["peak_mb"],
                "accuracy": acc,
            }
            with open(OUT / "peers.jsonl", "a") as fh:
                fh.write(json.dumps(rec) + "\n")
            print(
                f"| {stamp['date']} | {tool} | {p_students} | {wall:.0f} | {res['peak_mb']:.0f} "
                f"| {100 * statistics.mean(acc):.1f} ± {100 * sd:.1f}% |"
            )
    print(
        f"\nkdpipe's cache: {tools['kdpipe, from its cache']['cache_s']:.0f} s once; per student: "
        + ", ".join(f"{tool} {statistics.mean(r['student_s']):.0f} s" for tool, r in tools.items())
    )


if __name__ == "__main__":
    main()
