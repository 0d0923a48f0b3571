"""A trained model folder as an ONNX model folder, and its int8 dynamically quantised version
(docs/your-own-models-and-data.md, "Using the student you get").

:func:`export_onnx` traces the model with torch's TorchScript-based exporter (``torch.onnx.export(...,
dynamo=False)``; the dynamo exporter needs ``onnxscript``, which kdpipe does not install) into a graph whose batch
and sequence axes are free. The graph takes the inputs kdpipe's batches give the model (``input_ids``,
``attention_mask``, ``token_type_ids`` when the tokenizer makes them; a BiLSTM of sentence pairs also
``pair_input_ids`` and ``pair_attention_mask``) and gives ``logits`` [B, C]; a multi-head student also gives
``head_logits`` [M, B, C], every head's logits. The trace runs on a padded batch, so the attention mask's padding
path is what the graph keeps. Before the folder is written, ONNX Runtime runs the graph on check texts (as one
padded batch and one text at a time) and its logits must equal PyTorch's within ``atol``: a trace that froze a
branch of the model's Python code stops the export instead of shipping a wrong graph.

:func:`quantize_int8` turns an exported fp32 folder into an int8 one with ONNX Runtime's ``quantize_dynamic``
(weights int8, activations quantised to uint8 at run time, per batch), checked against the fp32 graph on the same
texts (the largest logit difference and the share of equal predictions are recorded, not bounded: that is what the
accuracy check of :func:`kdpipe.evaluation.exported.accuracy_drop` and :func:`flag_card` is for).

Every folder gets the tokenizer, ``labels.json``, the fp32 model's ``metrics.json``, ``onnx.json`` (what
:mod:`kdpipe.models.onnx_runtime` reads), a ``config.json`` that sends ``from_pretrained`` to kdpipe, a model card and
a manifest (kind ``onnx``) with every file's checksum, written atomically. A model ONNX cannot trace stops with one
line naming it.
"""

from __future__ import annotations

import logging
import shutil
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from kdpipe.core.checksums import write_manifest
from kdpipe.core.markdown import plain
from kdpipe.core.store import KdpipeError, atomic_path, make_manifest, read_json, write_json
from kdpipe.data.batching import collate, encode, model_inputs
from kdpipe.models.loading import check_model_folder, load_tokenizer, load_trained, write_kdpipe_config
from kdpipe.models.onnx_runtime import MODEL_FILE, SPEC_FILE, OnnxRunner, read_spec

OPSET = 17
EXPORTER = "torch.onnx.export (TorchScript-based, dynamo=False)"
MAX_POSITIONS = 1 << 20  # a max_length beyond this is a tokenizer's "no limit", not a model's
ATOL = 1e-4  # the largest logit difference, ONNX Runtime against PyTorch, an fp32 export may have (times max(1, |z|))
# Texts of different lengths, the last one longer than any max_length: the check batch has padding and truncation
CHECK_TEXTS = (
    "Shares rose after the results.",
    "The minister said the new rules would come into force next year, after a vote in parliament.",
    "Goal!",
    " ".join(["The match went to extra time and the crowd stayed until the last whistle."] * 60),
)
# Files of an exported folder its manifest does not pin (as for a trained model: the card may be edited)
UNCHECKED = ("manifest.json", "README.md")
# What quantize_int8 does not copy from the fp32 folder: it writes its own
OWN_FILES = (MODEL_FILE, SPEC_FILE, *UNCHECKED)


class _Graph(nn.Module):
    """The model behind a call with positional tensors (the graph's inputs, in order) that returns the graph's
    outputs as a tuple."""

    def __init__(self, model: nn.Module, inputs: list[str], outputs: list[str]):
        super().__init__()
        self.model, self.inputs, self.outputs = model, inputs, outputs

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model(**dict(zip(self.inputs, tensors)))
        return tuple(getattr(out, name) for name in self.outputs)


def check_batches(tokenizer, max_length: int, texts=None, *, separate_pairs: bool = False, pairs: bool = False):
    """The check inputs as kdpipe batches them (numpy int64 model inputs): ``texts`` and :data:`CHECK_TEXTS` (whose
    short text pads the others, whatever ``texts`` are) in one padded batch, longest first, then each text alone.
    ``separate_pairs``: the model tokenises the two sides of a pair apart (the BiLSTM); ``pairs``: it was built for
    sentence pairs, and each text gets the texts' reverse order as its pair."""
    texts = [*(texts or []), *CHECK_TEXTS]
    encoded = encode(
        tokenizer, texts, texts[::-1] if pairs else None, max_length=max_length, separate_pairs=separate_pairs
    )
    order = np.argsort(-encoded.lengths, kind="stable")
    batches = [collate(encoded, order), *(collate(encoded, np.array([i])) for i in range(len(texts)))]
    return [{k: v.numpy() for k, v in model_inputs(batch).items()} for batch in batches]


def _torch_outputs(model: nn.Module, feed: dict, outputs: list[str]) -> dict[str, np.ndarray]:
    with torch.inference_mode():
        out = model(**{k: torch.from_numpy(v) for k, v in feed.items()})
    return {name: getattr(out, name).float().numpy() for name in outputs}


def largest_difference(runner: OnnxRunner, reference, batches: list[dict]) -> tuple[float, float, float]:
    """(largest |logit difference|, largest |reference logit|, share of rows with the same top class) of the graph
    against ``reference(feed) -> {output: array}`` over ``batches``, every output compared."""
    diff = scale = 0.0
    same, rows = 0, 0
    for feed in batches:
        want, got = reference(feed), runner.run(feed)
        for name, value in want.items():
            diff = max(diff, float(np.abs(got[name] - value).max()))
            scale = max(scale, float(np.abs(value).max()))
        same += int((got["logits"].argmax(-1) == want["logits"].argmax(-1)).sum())
        rows += len(want["logits"])
    return diff, scale, same / max(rows, 1)


def export_onnx(
    model_dir: str | Path,
    out_dir: str | Path,
    *,
    name: str | None = None,
    opset: int = OPSET,
    check_texts: list[str] | None = None,
    atol: float = ATOL,
    max_length: int | None = None,
) -> dict:
    """Export the trained model folder ``model_dir`` (a teacher or a student: a Hugging Face classifier, a multi-head
    or a BiLSTM student) to the ONNX folder ``out_dir``; returns its manifest. ``name``: the model's name, in
    messages and the card (by default its folder's name, e.g. the student's); ``check_texts``: texts the graph is
    checked on besides a few fixed ones (:func:`check_batches`); ``max_length``: where the tokenizer cuts, by
    default the training ``max_length`` of a folder kdpipe wrote, else the tokenizer's own ``model_max_length``."""
    model_dir, out_dir = Path(model_dir), Path(out_dir)
    name = name or model_dir.name
    if (model_dir / SPEC_FILE).is_file():
        raise KdpipeError(f"export {name}: {model_dir} is an exported ONNX folder already")
    if not (model_dir / "labels.json").is_file():  # (its classes, in output order, are the exported folder's)
        raise KdpipeError(
            f"export {name}: {model_dir} is not a model folder kdpipe wrote (no labels.json); import a checkpoint "
            "as a teacher (teachers.<name>.checkpoint) and export the teacher's folder"
        )
    source = check_model_folder(model_dir) or {}
    model = load_trained(model_dir).eval()
    tokenizer = load_tokenizer(str(model_dir))
    max_length = int(max_length or (source.get("config") or {}).get("max_length") or tokenizer.model_max_length)
    if max_length > MAX_POSITIONS:  # (a tokenizer saved without a length says 10^30)
        raise KdpipeError(f"export {name}: the tokenizer of {model_dir} sets no max_length; give max_length")
    separate, pairs = bool(getattr(model, "separate_pairs", False)), bool(getattr(model.config, "pairs", False))
    batches = check_batches(tokenizer, max_length, check_texts, separate_pairs=separate, pairs=pairs)
    inputs = list(batches[0])
    heads = getattr(_probe(model, batches[0]), "head_logits", None)
    outputs = ["logits", *(["head_logits"] if heads is not None else [])]
    spec = {
        "format": "onnx",
        "file": MODEL_FILE,
        "precision": "fp32",
        "opset": opset,
        "exporter": EXPORTER,
        "torch": torch.__version__,
        "inputs": inputs,
        "outputs": outputs,
        "heads": None if heads is None else int(heads.shape[0]),
        "max_length": max_length,
        "pad_token_id": int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
        "separate_pairs": separate,
        "parameters": sum(p.numel() for p in model.parameters()),
        "labels": read_json(model_dir / "labels.json"),
        "source": {"name": name, "kind": source.get("kind")},
    }
    with atomic_path(out_dir, directory=True) as tmp:
        _trace(model, inputs, outputs, batches[0], tmp / MODEL_FILE, opset, name)
        write_json(tmp / SPEC_FILE, spec)
        write_json(tmp / "labels.json", spec["labels"])
        runner = _open(tmp, f"export {name}")
        diff, scale, same = largest_difference(runner, lambda feed: _torch_outputs(model, feed, outputs), batches)
        if not diff <= atol * max(1.0, scale):
            raise KdpipeError(
                f"export {name}: the ONNX graph's logits differ from PyTorch's by {diff:.3g} on the check texts "
                f"(allowed: {atol * max(1.0, scale):.3g}); the trace kept a branch of the model's code that other "
                "inputs do not take, so the graph is not written"
            )
        check = {"against": "pytorch", "rows": _rows(batches), "max_abs_logit_diff": diff, "same_prediction": same}
        tokenizer.model_max_length = max_length
        tokenizer.save_pretrained(tmp)
        if (model_dir / "metrics.json").is_file():
            shutil.copyfile(model_dir / "metrics.json", tmp / "metrics.json")
        _finish_folder(tmp, _describe_export(source, spec, check), spec)
    return read_json(out_dir / "manifest.json")


def _probe(model: nn.Module, feed: dict):
    with torch.inference_mode():
        return model(**{k: torch.from_numpy(v) for k, v in feed.items()})


def _rows(batches: list[dict]) -> int:
    return sum(len(feed["input_ids"]) for feed in batches)


def _trace(model: nn.Module, inputs: list[str], outputs: list[str], feed: dict, path: Path, opset: int, name: str):
    """Trace ``model`` on the padded batch ``feed`` into ``path``, batch and sequence axes free; a model ONNX cannot
    trace stops with one line naming it."""
    axes = {n: {0: "batch", 1: "pair_sequence" if n.startswith("pair_") else "sequence"} for n in inputs}
    axes.update({o: {1: "batch"} if o == "head_logits" else {0: "batch"} for o in outputs})
    graph = _Graph(model, inputs, outputs).eval()
    try:
        with warnings.catch_warnings():
            # (the TorchScript exporter's deprecation notice, and the tracer's notes on Python values it freezes:
            # the check against PyTorch's logits below is what tells whether a frozen value mattered)
            warnings.simplefilter("ignore")
            torch.onnx.export(
                graph,
                tuple(torch.from_numpy(feed[n]) for n in inputs),
                str(path),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes=axes,
                opset_version=opset,
                do_constant_folding=True,
                dynamo=False,
            )
    except Exception as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise KdpipeError(f"export {name}: ONNX cannot export this model ({type(err).__name__}: {first})") from err
    finally:
        model.eval()  # (the exporter gives the wrapper its own mode back afterwards, and with it every submodule's)


def _open(folder: Path, what: str) -> OnnxRunner:
    try:
        return OnnxRunner(folder, threads=torch.get_num_threads())
    except KdpipeError as err:
        raise KdpipeError(f"{what}: {err}") from err


def _describe_export(source: dict, spec: dict, check: dict) -> dict:
    """An exported folder's manifest (kind ``onnx``): the source model's config slice with the export's settings
    under ``export`` (``max_length`` stays where the evaluate stage and ``kdpipe predict`` read it), the source's
    classes, rows, tokenizer and gold-label record, what it was exported from and the check."""
    settings = {k: spec[k] for k in ("precision", "opset", "exporter", "torch", "inputs", "outputs", "heads")}
    if spec.get("quantisation"):
        settings["quantisation"] = spec["quantisation"]
    config = {**(source.get("config") or {}), "max_length": spec["max_length"], "export": settings}
    kept = {k: source[k] for k in ("method", "teachers", "tokenizer", "domain", "rows", "gold_labels") if k in source}
    manifest = make_manifest("onnx", labels=spec["labels"], source=spec["source"], **kept, check=check)
    return {**manifest, "config": config}  # (a model's configuration as recorded, not the settings of a job)


def _finish_folder(tmp: Path, manifest: dict, spec: dict) -> None:
    """The config marker, the card and the manifest with the checksum of every other file."""
    write_kdpipe_config(tmp, "onnx")
    (tmp / "README.md").write_text(exported_card(manifest, spec))
    files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
    write_manifest(tmp / "manifest.json", manifest, [f for f in files if f not in UNCHECKED])


def quantize_int8(
    onnx_dir: str | Path,
    out_dir: str | Path,
    *,
    check_texts: list[str] | None = None,
    per_channel: bool = False,
    reduce_range: bool = False,
) -> dict:
    """The int8 version of the exported fp32 folder ``onnx_dir``, written to ``out_dir`` with its tokenizer, classes
    and metrics; returns its manifest. ONNX Runtime's ``quantize_dynamic`` gives MatMul, Gather and the other
    operators it supports int8 weights (QInt8), per tensor unless ``per_channel``, 7-bit with ``reduce_range`` (for
    CPUs without VNNI instructions)."""
    from onnxruntime import __version__ as ort_version
    from onnxruntime.quantization import QuantType, quantize_dynamic

    onnx_dir, out_dir = Path(onnx_dir), Path(out_dir)
    source = check_model_folder(onnx_dir) or {}
    spec = read_spec(onnx_dir)
    what = f"quantise {spec['source']['name']}"
    if spec.get("precision") != "fp32":
        raise KdpipeError(f"{what}: {onnx_dir} is {spec.get('precision')}, not an fp32 export")
    fp32 = _open(onnx_dir, what)
    tokenizer = load_tokenizer(str(onnx_dir))
    with atomic_path(out_dir, directory=True) as tmp:
        for path in sorted(onnx_dir.iterdir()):
            if path.is_file() and path.name not in OWN_FILES:
                shutil.copyfile(path, tmp / path.name)
        try:
            # (its advice to pre-process the graph first is left unsaid: on these graphs the symbolic shape inference
            # of ``quant_pre_process`` fails, and without it the quantised graph is no faster)
            logging.disable(logging.WARNING)
            quantize_dynamic(
                onnx_dir / MODEL_FILE,
                tmp / MODEL_FILE,
                weight_type=QuantType.QInt8,
                per_channel=per_channel,
                reduce_range=reduce_range,
            )
        except Exception as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise KdpipeError(f"{what}: quantize_dynamic failed ({type(err).__name__}: {first})") from err
        finally:
            logging.disable(logging.NOTSET)
        quantisation = {
            "method": "dynamic (onnxruntime.quantization.quantize_dynamic)",
            "weights": "int8 (QInt8), " + ("per channel" if per_channel else "per tensor"),
            "activations": "uint8, scale and zero point computed per batch at run time",
            "reduce_range": reduce_range,
            "onnxruntime": ort_version,
            "from": onnx_dir.name,
        }
        int8_spec = {**spec, "precision": "int8", "quantisation": quantisation}
        write_json(tmp / SPEC_FILE, int8_spec)
        runner = _open(tmp, what)
        inputs = spec["inputs"]
        batches = check_batches(
            tokenizer,
            int(spec["max_length"]),
            check_texts,
            separate_pairs=bool(spec.get("separate_pairs")),
            pairs="pair_input_ids" in inputs,
        )
        diff, _, same = largest_difference(runner, fp32.run, batches)
        check = {"against": "onnx fp32", "rows": _rows(batches), "max_abs_logit_diff": diff, "same_prediction": same}
        _finish_folder(tmp, _describe_export(source, int8_spec, check), int8_spec)
    return read_json(out_dir / "manifest.json")


# ---- the model card ------------------------------------------------------------------------------------------


def exported_card(manifest: dict, spec: dict, flag: dict | None = None) -> str:
    """The card (``README.md``) of an exported folder: what the graph is (precision, quantisation, opset, exporter,
    the model it comes from), its check, its classes, how to run it; with ``flag``
    (:func:`kdpipe.evaluation.exported.accuracy_drop`) the accuracy the quantisation cost."""
    precision = spec.get("precision", "fp32")
    source = manifest.get("source") or {}
    origin = f"{source.get('kind') or 'model'} {plain(source.get('name'))}"
    if precision == "int8":
        what = f"The int8 dynamically quantised version of the ONNX export of the {origin}."
    else:
        what = f"An ONNX export of the {origin} (fp32)."
    if manifest.get("method"):
        teachers = ", ".join(plain(t) for t in manifest.get("teachers") or []) or "no teacher"
        what += f" The student was distilled by kdpipe with the method `{manifest['method']}` from {teachers}."
    check = manifest.get("check") or {}
    lines = [
        "---",
        "library_name: onnx",
        "pipeline_tag: text-classification",
        f"tags: [knowledge-distillation, kdpipe, onnx{', int8' if precision == 'int8' else ''}]",
        "---",
        "",
        f"# ONNX model ({precision})",
        "",
        what,
        "",
        "## Graph",
        "",
        f"- precision: {precision}",
    ]
    quantisation = spec.get("quantisation")
    if quantisation:
        lines += [
            f"- quantisation: {quantisation['method']}; weights {quantisation['weights']}; activations "
            f"{quantisation['activations']}; onnxruntime {quantisation['onnxruntime']}"
        ]
    lines += [
        f"- opset: {spec.get('opset')}",
        f"- exporter: {spec.get('exporter')}, torch {spec.get('torch')}",
        f"- inputs: {', '.join(spec.get('inputs', []))} (int64, [batch, sequence]; batch and sequence free)",
        "- outputs: "
        + ", ".join(
            f"{o} {'[heads, batch, classes]' if o == 'head_logits' else '[batch, classes]'}"
            for o in spec.get("outputs", [])
        ),  # fmt: skip
        f"- max_length: {spec.get('max_length')} (the tokenizer cuts texts there, as when the model was trained)",
        f"- parameters of the fp32 model: {int(spec.get('parameters') or 0):,}",
    ]
    if check:
        lines += [
            f"- check against {check.get('against')} on {check.get('rows')} rows: largest logit difference "
            f"{check.get('max_abs_logit_diff', float('nan')):.3g}, the same prediction for "
            f"{100 * check.get('same_prediction', float('nan')):.1f}% of them",
        ]
    if spec.get("heads"):
        lines += ["", f"A multi-head student: `logits` is the log of its {spec['heads']} heads' mean probability, "
                  "`head_logits` each head's logits."]  # fmt: skip
    classes = ", ".join(plain(c) for c in manifest.get("labels", []))
    lines += ["", "## Data", "", f"Classes, in output order: {classes}."]
    if flag:
        lines += ["", *flag_lines(flag)]
    lines += [
        "",
        "## Use",
        "",
        "```python",
        "from kdpipe.models.onnx_runtime import OnnxRunner",
        "",
        'model = OnnxRunner("PATH/TO/THIS/FOLDER", threads=2)',
        'model.predict_proba(["first text", "second text"])  # [texts, classes], columns in the order above',
        "```",
        "",
        "Or predict on a file: `kdpipe predict --model PATH/TO/THIS/FOLDER --input texts.csv --out predictions.csv`.",
        "",
    ]
    return "\n".join(lines)


def flag_lines(flag: dict) -> list[str]:
    """The card's section on what quantisation cost, from :func:`kdpipe.evaluation.exported.accuracy_drop`."""
    verdict = (
        f"**Flagged**: accuracy falls by more than {100 * flag['margin']:.1f} points"
        if flag["flagged"]
        else f"Not flagged: accuracy falls by at most {100 * flag['margin']:.1f} points"
    )
    interval = flag.get("interval")
    between = f" (95% paired interval {100 * interval[0]:+.1f} to {100 * interval[1]:+.1f})" if interval else ""
    return [
        "## Accuracy check",
        "",
        f"{verdict}. On the {flag['split']} split ({flag['n']:,} rows) the int8 model is right for "
        f"{100 * flag['accuracy']:.1f}% against {100 * flag['reference_accuracy']:.1f}% for the fp32 model "
        f"{plain(flag['reference'])}: {100 * flag['difference']:+.1f} points{between}; ECE "
        f"{flag['ece']:.3f} against {flag['reference_ece']:.3f}.",
    ]


def flag_card(folder: str | Path, flag: dict) -> None:
    """Rewrite the card of the exported folder ``folder`` with the accuracy check ``flag``
    (:func:`kdpipe.evaluation.exported.accuracy_drop`); the card is not among the files its manifest pins."""
    folder = Path(folder)
    manifest = read_json(folder / "manifest.json")
    with atomic_path(folder / "README.md") as tmp:
        tmp.write_text(exported_card(manifest, read_spec(folder), flag))
