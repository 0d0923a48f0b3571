"""MC-dropout throughput: kdpipe's implementation against the naive loop, side by side on the same data.

Naive (the seed's way): the model in train mode, T separate passes over the data, batches of 32 padded to
max_length, fp32. kdpipe (``kdpipe.signals.mc_dropout.mc_dropout``): length-bucketed batches padded only to their own
longest row, the T samples of a batch as one enlarged batch, ``inference_mode``, and on CUDA bf16 autocast with
SDPA attention. Both score the same rows of BBC News with the packaged MiniLM (6 layers) and T samples.

    python benchmarks/mc_dropout.py --max-length 512 --rows 64          # long, varied lengths
    python benchmarks/mc_dropout.py --max-length 128 --rows 256 --titles  # short texts (article titles)
    python benchmarks/mc_dropout.py --breakdown --max-length 96 --rows 64  # where an MC sample's extra cost goes

``--breakdown`` times one forward of the same enlarged batch (``rows`` rows, all ``max_length`` tokens) five ways,
interleaved and repeated so that a busy machine slows each alike: eval mode (the deterministic pass), every dropout
on (an MC-dropout sample), only the ``nn.Dropout`` modules on (hidden states, embeddings, classifier), only the
attention modules on (attention-probability dropout, which also sends SDPA to its math kernel), and every dropout on
with the masks drawn by numpy instead of torch (``NumpyMasks``, an experiment kdpipe does not run); then the share
of an MC forward's CPU time that torch's profiler gives the Bernoulli mask draws.

Prints one Markdown row per setting and appends a JSON record to benchmarks/out/mc_dropout.jsonl.
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from bench_common import bbc_train_rows, parser, record, setup
from torch.overrides import TorchFunctionMode

from kdpipe.data.batching import encode_frame
from kdpipe.models.loading import load_classifier, load_tokenizer
from kdpipe.signals.mc_dropout import mc_dropout


@torch.inference_mode()
def naive_mc(model, tokenizer, texts, *, samples: int, max_length: int, device, batch_size: int = 32) -> np.ndarray:
    """T full passes over the data, each batch padded to max_length, dropout via model.train(), fp32."""
    model.train()
    total = None
    for _ in range(samples):
        probs = []
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[start : start + batch_size],
                padding="max_length",
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            ).to(device)
            probs.append(torch.softmax(model(**enc).logits.float(), -1).cpu())
        stacked = torch.cat(probs)
        total = stacked if total is None else total + stacked
    return (total / samples).numpy()


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


class NumpyMasks(TorchFunctionMode):
    """Dropout with its keep masks drawn by numpy's PCG64 instead of torch's CPU generator (an experiment: kdpipe does
    not run this, since it would change every MC-dropout artifact). Intercepts ``F.dropout`` and, for a
    ``scaled_dot_product_attention`` with ``dropout_p``, computes the attention by hand so that its probabilities can
    be masked; in-place ops keep the extra passes over the masks to two."""

    def __init__(self, seed: int = 0):
        super().__init__()
        self.rng = np.random.Generator(np.random.PCG64(seed))

    def keep(self, shape, p: float) -> torch.Tensor:
        """1 / (1 - p) where a unit is kept, 0 where it is dropped, as float32."""
        u = torch.from_numpy(self.rng.random(math.prod(shape), dtype=np.float32)).view(shape)
        return u.ge_(p).mul_(1.0 / (1.0 - p))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.dropout:
            bound = dict(zip(("input", "p", "training", "inplace"), args), **kwargs)
            x, p = bound["input"], bound.get("p", 0.5)
            if bound.get("training", True) and p > 0:
                return x * self.keep(x.shape, p)
        elif func is F.scaled_dot_product_attention:
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            bound = dict(zip(names, args), **kwargs)
            p = bound.get("dropout_p", 0.0)
            if p > 0 and not bound.get("is_causal") and not bound.get("enable_gqa"):
                q, k, v, mask = bound["query"], bound["key"], bound["value"], bound.get("attn_mask")
                scores = (q @ k.transpose(-2, -1)).mul_(bound.get("scale") or 1.0 / math.sqrt(q.shape[-1]))
                if mask is not None and mask.dtype == torch.bool:
                    scores.masked_fill_(~mask, float("-inf"))
                elif mask is not None:
                    scores.add_(mask)
                probs = torch.softmax(scores, -1)
                return probs.mul_(self.keep(probs.shape, p)) @ v
        return func(*args, **kwargs)


def breakdown(model, rows: int, width: int, repeats: int) -> dict:
    """Seconds per forward of one [rows, width] batch in each mode (the median of ``repeats``), and each mode's
    ratio to eval mode."""
    from kdpipe.models.inference import enable_dropout

    inputs = {
        "input_ids": torch.randint(1000, 20000, (rows, width)),
        "attention_mask": torch.ones(rows, width, dtype=torch.long),
    }

    def only(kind):
        model.eval()
        for module in model.modules():
            is_attention = type(module).__name__.endswith("Attention")
            if (kind == "dropout" and isinstance(module, torch.nn.Dropout)) or (kind == "attention" and is_attention):
                module.train()

    modes = {
        "eval": model.eval,
        "mc": lambda: enable_dropout(model),
        "hidden_dropout_only": lambda: only("dropout"),
        "attention_dropout_only": lambda: only("attention"),
        "mc_numpy_masks": lambda: enable_dropout(model),
    }
    times = {mode: [] for mode in modes}
    numpy_masks = NumpyMasks()
    with torch.inference_mode():
        for _ in range(repeats):
            for mode, prepare_mode in modes.items():
                prepare_mode()
                start = time.perf_counter()
                if mode == "mc_numpy_masks":
                    with numpy_masks:
                        model(**inputs)
                else:
                    model(**inputs)
                times[mode].append(time.perf_counter() - start)
        enable_dropout(model)  # the mask draws' share of an MC forward, by torch's profiler (they run in C++)
        with torch.profiler.profile() as prof:
            model(**inputs)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    draws = sum(e.self_cpu_time_total for e in events if e.key in ("aten::bernoulli_", "aten::bernoulli"))
    median = {mode: float(np.median(values)) for mode, values in times.items()}
    ratio = {mode: median[mode] / median["eval"] for mode in modes}
    return {"seconds": median, "ratio": ratio, "mask_draw_share": draws / total}


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=16, help="kdpipe's examples per batch (x T rows enlarged)")
    p.add_argument("--max-batch-rows", type=int, default=128)
    p.add_argument("--titles", action="store_true", help="use only each article's title line (short texts)")
    p.add_argument("--breakdown", action="store_true", help="time one batch in five dropout modes (see above)")
    p.add_argument("--repeats", type=int, default=7, help="--breakdown: forwards per mode")
    args = p.parse_args()
    device = setup(args)
    if args.breakdown:
        model = load_classifier("builtin:minilm-l6", list("abcde"), seed=0).to(device)
        result = breakdown(model, args.rows, args.max_length, args.repeats)
        rec = record("mc_dropout_breakdown", device, rows=args.rows, max_length=args.max_length, **result)
        print("| threads | batch | " + " | ".join(result["ratio"]) + " |")
        print("| ---: | --- |" + " ---: |" * len(result["ratio"]))
        cells = " | ".join(f"{result['seconds'][m]:.3f} s ({result['ratio'][m]:.2f}x)" for m in result["ratio"])
        print(f"| {rec['threads']} | {args.rows} x {args.max_length} | {cells} |")
        print(f"mask draws (bernoulli): {100 * result['mask_draw_share']:.0f}% of an MC forward's CPU time")
        return
    frame = bbc_train_rows(args.rows)
    if args.titles:
        frame = frame.assign(text=frame["text"].str.split("\n").str[0])
    tokenizer = load_tokenizer("builtin:minilm-l6")
    encoded = encode_frame(tokenizer, frame, max_length=args.max_length)
    texts = frame["text"].tolist()

    naive_model = load_classifier("builtin:minilm-l6", list("abcde"), seed=0).to(device)  # SDPA, fp32
    ours_model = load_classifier("builtin:minilm-l6", list("abcde"), seed=0).to(device)

    def run_naive():
        return naive_mc(naive_model, tokenizer, texts, samples=args.samples, max_length=args.max_length, device=device)

    def run_ours():
        return mc_dropout(
            ours_model,
            encoded,
            samples=args.samples,
            seed=0,
            batch_size=args.batch_size,
            max_batch_rows=args.max_batch_rows,
            device=device,
        )

    if device.type == "cuda":  # warm up kernels and the allocator before timing
        run_naive(), run_ours()
    t_naive = timed(run_naive, device)
    t_ours = timed(run_ours, device)
    rec = record(
        "mc_dropout",
        device,
        rows=len(texts),
        samples=args.samples,
        max_length=args.max_length,
        titles=args.titles,
        mean_tokens=float(encoded.lengths.mean()),
        naive_seq_per_s=len(texts) / t_naive,
        kdpipe_seq_per_s=len(texts) / t_ours,
        speedup=t_naive / t_ours,
    )
    print("| device | texts | max_length | mean tokens | T | rows | naive seq/s | kdpipe seq/s | speed-up |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(
        f"| {rec['device_name']} ({rec['threads']} threads) | {'titles' if args.titles else 'articles'} | "
        f"{args.max_length} | {rec['mean_tokens']:.0f} | {args.samples} | {len(texts)} | "
        f"{rec['naive_seq_per_s']:.2f} | {rec['kdpipe_seq_per_s']:.2f} | {rec['speedup']:.2f}x |"
    )


if __name__ == "__main__":
    main()
