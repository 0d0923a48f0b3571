"""One training job on several devices: the wall time of a teacher fine-tuning job with 1 and with N processes.

Side by side in one run: BBC News is prepared once, then `python -m kdpipe finetune-teacher` (the workflow's own
command) fine-tunes the same MiniLM teacher with the same settings and the same global batch, once as one process
with all the threads and once as N data-parallel processes sharing them (`--processes N`, torchrun; gloo on a CPU,
NCCL on GPUs). The ratio of wall times is the result; the validation accuracy and NLL of both are printed beside it
(they agree in distribution, not bit for bit: each process draws its own dropout masks).

    python data_parallel.py                           # 2-core CPU: 2 processes of 1 thread vs 1 of 2
    python data_parallel.py --processes 4 --threads 16 --epochs 1 --max-length 256   # a 4-GPU machine

Prints one Markdown row and appends a JSON record to benchmarks/out/data_parallel.jsonl.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from bench_common import BBC, parser, record, setup

from kdpipe.data.prepare import prepare
from kdpipe.data.settings import DatasetSettings


def teacher_params(args) -> dict:
    return {
        "backbone": "builtin:minilm-l6",
        "classes": None,
        "epochs": args.epochs,
        "lr": 5e-5,
        "batch_size": args.batch_size,
        "eval_batch_size": 64,
        "max_length": args.max_length,
        "warmup_ratio": 0.1,
        "weight_decay": 0.01,
        "max_grad_norm": 1.0,
        "seed": 0,
        "checkpoint_every": 0,
    }


def train(data: Path, out: Path, params: dict, threads: int, processes: int) -> tuple[float, dict]:
    cmd = [sys.executable, "-m", "kdpipe", "--threads", str(threads), "--processes", str(processes)]
    cmd += ["finetune-teacher", "--params", json.dumps(params), "--data", str(data), "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd[:8])} ... failed:\n{done.stderr[-3000:]}")
    return wall, json.loads((out / "metrics.json").read_text())


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--processes", type=int, default=2, help="N, the processes of the data-parallel run")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16, help="the global batch, the same in both runs")
    p.add_argument("--max-length", type=int, default=96)
    args = p.parse_args()
    device = setup(args)
    params = teacher_params(args)
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "bbc"
        prepare(DatasetSettings.of_section(BBC), data)
        one_s, one = train(data, Path(tmp) / "one" / "t", params, args.threads, 1)
        many_s, many = train(data, Path(tmp) / "many" / "t", params, args.threads, args.processes)
    rec = record(
        "data_parallel",
        device,
        processes=args.processes,
        threads_total=args.threads,
        epochs=args.epochs,
        batch_size=args.batch_size,
        max_length=args.max_length,
        one_process_s=round(one_s, 1),
        data_parallel_s=round(many_s, 1),
        speedup=round(one_s / many_s, 2),
        one_process_validation=one["validation"],
        data_parallel_validation=many["validation"],
        torch=torch.__version__,
    )
    print("| date | device | processes | threads | epochs | one process s | N processes s | speed-up | val acc 1 / N |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    print(
        f"| {rec['date']} | {rec['device_name']} | {args.processes} | {args.threads} | {args.epochs} | {one_s:.0f} "
        f"| {many_s:.0f} | **{one_s / many_s:.2f}x** | {one['validation']['accuracy']:.3f} / "
        f"{many['validation']['accuracy']:.3f} |"
    )


if __name__ == "__main__":
    main()
