"""Meta-KD's first stage from the cache against the teacher online: what the attention and hidden-state dumps buy.

Cached is kdpipe's way: the teacher's hidden states (0, 3, 6) and attention maps (layers 3, 6, every head) of the
training rows are dumped once to float16 memory-mapped npy files without padding (``kdpipe.signals.features``, as
the workflow's dump jobs do); each stage-1 step reads its batch's rows from them, padded to the batch's width.
Online is the way without a cache: every step first runs the 6-layer teacher (eval mode, eager attention, hidden
states and attentions returned) on the batch. Both then run the same ``kdpipe.methods.meta_kd.student`` stage-1
objective (the online way copies the teacher's outputs into the arrays the objective reads, a negligible cost beside
the forward pass) on the same 2-layer student, batches and rows. The one-off cost of the dump and its size are
reported beside.

    python benchmarks/meta_kd_stage1.py --rows 96 --max-length 128
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import bbc_train_rows, parser, record, setup

from kdpipe.core.device import autocast
from kdpipe.data.batching import collate, encode_frame, model_inputs, training_batches
from kdpipe.methods.base import DistillContext
from kdpipe.methods.meta_kd.student import build_stage1
from kdpipe.methods.registry import method_args
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.models.settings import StudentModel
from kdpipe.models.students import build_student
from kdpipe.signals.features import dump_feature
from kdpipe.signals.load import TokenFeature
from kdpipe.training.loop import TrainSettings, make_optimizer

LABELS = ["business", "entertainment", "politics", "sport", "tech"]
HIDDEN, ATTENTIONS = [0, 3, 6], [3, 6]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


class Live:
    """The online way's features: the teacher's outputs of the current batch, written into a dense array [N, ...]
    and read back as a dump's rows padded to the batch's width."""

    def __init__(self, feature: str, encoded, layers: list[int]):
        n, width = len(encoded), int(encoded.lengths.max())
        shape = (n, len(layers), width, 384) if feature == "hidden" else (n, len(layers), 12, width, width)
        self.feature, self.layers, self.dense = feature, layers, np.zeros(shape, dtype=np.float32)
        self.lengths, self.token_hashes, self.hidden_size = encoded.lengths, None, 384
        self.heads = 12 if feature == "attentions" else None

    def batch(self, index, slot, width, device):
        cut = (slice(None, width),) if self.feature == "hidden" else (..., slice(None, width), slice(None, width))
        rows = self.dense[index, slot][cut]
        return torch.from_numpy(rows).to(device, non_blocking=True)


def context(encoded, features: dict, student, device) -> DistillContext:
    n = len(encoded)
    rng = np.random.default_rng(0)
    signals = {
        "labels": LABELS,
        "domain": rng.normal(size=(n, 384)).astype(np.float16),
        "expertise": torch.full((n,), 0.4, device=device),
        **features,
    }
    return DistillContext(
        labels=LABELS,
        teachers=["t"],
        blocks={"t": np.arange(5)},
        signals={"t": signals},
        device=device,
        student_config=student.config,
        train_lengths=encoded.lengths,
        alignment={"t": [[0, 0], [1, 3], [2, 6]]},
        domains=["a", "b"],
        domain_ids=torch.as_tensor(np.arange(n) % 2, device=device),
        prototype_scores=torch.as_tensor(rng.uniform(0.5, 1.0, n), dtype=torch.float32, device=device),
    )


@torch.no_grad()
def teacher_features(teacher, batch, features: dict, device) -> None:
    """The online way: the teacher on the batch, its outputs written where the objective reads them."""
    with autocast(device):
        out = teacher(**model_inputs(batch), output_hidden_states=True, output_attentions=True)
    rows, width = batch["index"].cpu().numpy(), batch["input_ids"].shape[1]
    hidden = torch.stack([out.hidden_states[l] for l in HIDDEN], 1).float().cpu().numpy()
    features["hidden"].dense[rows, :, :width] = hidden
    attentions = torch.stack([out.attentions[l - 1] for l in ATTENTIONS], 1).float().cpu().numpy()
    features["attentions"].dense[rows, :, :, :width, :width] = attentions


def epoch_seconds(online: bool, teacher, encoded, features: dict, device) -> float:
    spec = StudentModel.from_params({"init": {"from": "builtin:minilm-l6", "layers": [0, 5]}})
    student, _ = build_student(spec, LABELS, seed=0, attn="eager")
    student.to(device).train()
    objective = build_stage1(context(encoded, features, student, device), method_args("meta_kd_stage1", {}))
    adapters = objective.extra_modules["meta_kd_adapters"][0]
    settings = TrainSettings(epochs=1, lr=1e-4)
    batches = training_batches(encoded.lengths, 16, seed=0, epoch=0)
    optimizer, _ = make_optimizer({"model": (student, 1e-4), "adapters": (adapters, 1e-4)}, settings, len(batches))
    sync(device)
    start = time.perf_counter()
    for index in batches:
        batch = collate(encoded, index, device)
        if online:
            teacher_features(teacher, batch, features, device)
        with autocast(device):
            loss, _ = objective.loss(student, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    sync(device)
    return time.perf_counter() - start


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=96)
    p.add_argument("--max-length", type=int, default=128)
    args = p.parse_args()
    device = setup(args)
    encoded = encode_frame(load_tokenizer("builtin:minilm-l6"), bbc_train_rows(args.rows), max_length=args.max_length)
    teacher = load_classifier("builtin:minilm-l6", LABELS, seed=1, attn="eager").to(device).eval()
    width = int(encoded.lengths.max())
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        for feature, layers in (("hidden", HIDDEN), ("attentions", ATTENTIONS)):
            dump_feature(
                teacher,
                encoded,
                feature,
                layers,
                Path(tmp) / f"{feature}.npy",
                batch_size=32,
                device=device,
            )
        dump_s = time.perf_counter() - started
        dump_bytes = sum(f.stat().st_size for f in Path(tmp).glob("*.npy"))
        cached_features = {
            f: TokenFeature.packed(
                f, np.load(Path(tmp) / f"{f}.npy", mmap_mode="r"), encoded.lengths, layers, hidden_size=384, heads=12
            )
            for f, layers in (("hidden", HIDDEN), ("attentions", ATTENTIONS))
        }
        live = {f: Live(f, encoded, layers) for f, layers in (("hidden", HIDDEN), ("attentions", ATTENTIONS))}
        epoch_seconds(True, teacher, encoded, live, device)  # warm-up: first-call costs, page cache
        cached = epoch_seconds(False, teacher, encoded, cached_features, device)
        online = epoch_seconds(True, teacher, encoded, live, device)
    rec = record(
        "meta_kd_stage1",
        device,
        rows=args.rows,
        max_length=args.max_length,
        dump_s=dump_s,
        dump_bytes=dump_bytes,
        cached_s=cached,
        online_s=online,
        ratio=online / cached,
    )
    print("| device | rows | S | dump (one-off) | cached s/epoch | online s/epoch | online / cached |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {device} ({rec['threads']} threads) | {args.rows} | {width} | {dump_s:.1f} s, "
        f"{dump_bytes / args.rows / 1e3:.0f} KB/row | {cached:.1f} | {online:.1f} | {online / cached:.2f}x |"
    )


if __name__ == "__main__":
    main()
