"""What caching buys: a student epoch from cached teacher signals against running the teachers online.

Online is the seed's way: every training step runs the K teachers on the batch (eval mode for logits) and, for
MUKI, M = 16 dropout-on passes per teacher for the uncertainty scores, then the student step. Cached is kdpipe's
way: the student step alone, indexing precomputed targets (``kdpipe.methods.muki`` precomputes q and m once).
Both use the same student (2-layer MiniLM init), batches (16, length-bucketed) and BBC rows; the time of the
measured steps is scaled to one epoch of the 1,489-row training split.

    python benchmarks/cache_vs_online.py --rows 32
"""

from __future__ import annotations

import time

import torch
from bench_common import bbc_train_rows, parser, record, setup

from kdpipe.core.device import autocast
from kdpipe.data.batching import collate, encode_frame, model_inputs, training_batches
from kdpipe.methods.losses import union_logits, vanilla_kd_loss
from kdpipe.methods.muki import aggregate, margin_weights, muki_loss, padded_probs
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.models.settings import StudentModel
from kdpipe.models.students import build_student
from kdpipe.signals.mc_dropout import enable_dropout, mc_dropout_samples, summarise

TRAIN_ROWS = 1489
LABELS = ["business", "entertainment", "politics", "sport", "tech"]
BLOCKS = [torch.tensor([0, 1]), torch.tensor([2, 3, 4])]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def teacher_targets(teachers, batch, method: str, samples: int, device):
    """What the online way computes every step: teacher logits, and for MUKI the MC-dropout scores."""
    with torch.no_grad():  # not inference_mode: the targets enter the student's autograd graph
        logits = []
        for t in teachers:
            t.eval()
            with autocast(device):
                logits.append(t(**model_inputs(batch)).logits.float())
        if method == "vanilla_kd":
            return union_logits(logits, BLOCKS, len(LABELS)), None
        scores = []
        for t in teachers:
            enable_dropout(t)
            s = mc_dropout_samples(t, batch, samples=samples, seed=0, max_batch_rows=256, device=device)
            scores.append(torch.as_tensor(summarise(s)["certainty"], device=device))  # summarise gives numpy
        padded = padded_probs(logits, BLOCKS, len(LABELS), 1.0)
        scores = torch.stack(scores, 1)
        return aggregate(padded, scores, "soft", 0.2), margin_weights(scores)


def student_step(student, optimizer, batch, target, weight, method, device):
    with autocast(device):
        z = student(**model_inputs(batch)).logits
    loss = vanilla_kd_loss(z, target, 5.0) if method == "vanilla_kd" else muki_loss(z, target, weight, 1.0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def epoch_seconds(method: str, online: bool, teachers, encoded, args, device) -> float:
    spec = StudentModel.from_params({"init": {"from": "builtin:minilm-l6", "layers": [0, 5]}})
    student, _ = build_student(spec, LABELS, seed=0)
    student.to(device).train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)
    batches = training_batches(encoded.lengths, 16, seed=0, epoch=0)
    cached = {}
    if not online:  # the cache: built once, before training (not timed: it is the MC-dropout/dump jobs' work)
        for index in batches:
            batch = collate(encoded, index, device)
            batch["row_ids"] = torch.as_tensor(index)
            cached[tuple(index)] = teacher_targets(teachers, batch, method, args.samples, device)
    sync(device)
    start = time.perf_counter()
    for index in batches:
        batch = collate(encoded, index, device)
        batch["row_ids"] = torch.as_tensor(index)
        target, weight = (
            teacher_targets(teachers, batch, method, args.samples, device) if online else cached[tuple(index)]
        )
        student_step(student, optimizer, batch, target, weight, method, device)
    sync(device)
    return (time.perf_counter() - start) * TRAIN_ROWS / len(encoded)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--max-length", type=int, default=96)
    args = p.parse_args()
    device = setup(args)
    frame = bbc_train_rows(args.rows)
    encoded = encode_frame(load_tokenizer("builtin:minilm-l6"), frame, max_length=args.max_length)
    teachers = [
        load_classifier("builtin:minilm-l6", LABELS[:2], seed=1).to(device),
        load_classifier("builtin:minilm-l6", LABELS[2:], seed=2).to(device),
    ]
    rows = []
    for method in ("vanilla_kd", "muki"):
        if device.type == "cuda":
            epoch_seconds(method, True, teachers, encoded, args, device)  # warm-up
        cached = epoch_seconds(method, False, teachers, encoded, args, device)
        online = epoch_seconds(method, True, teachers, encoded, args, device)
        rows.append({"method": method, "cached_s": cached, "online_s": online, "ratio": online / cached})
    rec = record(
        "cache_vs_online",
        device,
        rows_measured=args.rows,
        samples=args.samples,
        max_length=args.max_length,
        results=rows,
    )
    print("| device | method | teachers online per step | cached s/epoch | online s/epoch | online / cached |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        what = "2 eval passes" if r["method"] == "vanilla_kd" else f"2 eval + 2x{args.samples} dropout passes"
        print(
            f"| {device} ({rec['threads']} threads) | {r['method']} | {what} | {r['cached_s']:.0f} | "
            f"{r['online_s']:.0f} | {r['ratio']:.1f}x |"
        )


if __name__ == "__main__":
    main()
