"""The ``evaluate`` stage: metrics and predictions of one trained model on every split it is evaluated on.

One job per model (docs/caching-and-reruns.md, "Rerun rules"): the model is loaded once, then each split is evaluated in
turn, exactly as a job of that split alone would write it: a subset teacher on the rows of its own classes, a model of
one ``domain`` on that domain's rows, every other model on all rows. Every model gets the uncertainty split of
docs/methods.md §3 over its members (with ``evaluate.mc_samples`` the MC-dropout scores too), and with ``evaluate.ood``
a last split ``ood`` (docs/methods.md, "Judging uncertainty"). The outputs are :mod:`kdpipe.evaluation.results`'.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kdpipe.core.device import pick_device
from kdpipe.core.memory import release_freed_memory
from kdpipe.core.store import KdpipeError, read_json
from kdpipe.data.batching import encode_frame, without_texts
from kdpipe.data.dataset import OOD, dataset_domains, read_split, restrict_to_domain
from kdpipe.evaluation.results import remove_stale, write_evaluation, write_ood
from kdpipe.evaluation.settings import EvalSettings
from kdpipe.models.inference import dropout_rates, mc_member_logits, predict_logits, softmax
from kdpipe.models.loading import count_parameters, load_tokenizer, load_trained

# A split's predictions, kept for the OOD rows' comparison: member probabilities [M, N, C], MC-dropout samples
# [T·M, N, C] (or None) and the accuracy
Predicted = tuple[np.ndarray, np.ndarray | None, float]
# The comparison of an exported model with the model it was made from, imported by name: only the evaluations that
# compare rerun when it changes.
REFERENCE_MODULE = "kdpipe.evaluation.exported"


@dataclass(frozen=True)
class Loaded:
    """A trained model, loaded once for every split it is evaluated on, and what each split's record says of it."""

    model: Any
    tokenizer: Any
    classes: list[str]
    max_length: int
    device: Any
    params: int  # parameters
    train_time_s: float | None
    gold_labels: dict | None  # what the model read to be made ({split: rows})
    transfer_rows: int  # and the unlabelled rows it learnt from


def run(
    settings: EvalSettings,
    model: Path,
    data: Path,
    out_json: list[Path],
    out_predictions: list[Path],
    ood: list[Path] = (),
    reference: Path | None = None,
) -> list[dict]:
    """Evaluate ``model`` on each of ``settings.splits`` (``out_json``, ``out_predictions``: a path per split, in that
    order); ``ood``: an external OOD set, if any (else the dataset's ``ood`` split); ``reference``: the
    evaluation folder of the model an exported one was made from, which each split's record is compared with."""
    remove_stale(Path(out_json[0]).parent, list(settings.splits))
    loaded = load(Path(model))
    done: dict[str, Predicted] = {}
    results = []
    for split, json_path, predictions_path in zip(settings.splits, out_json, out_predictions, strict=True):
        if split == OOD:  # after test (the plan puts it last): its rows are the in-distribution side
            results.append(evaluate_ood(settings, loaded, Path(ood or data), done["test"], json_path, predictions_path))
        else:
            result, done[split] = evaluate_split(settings, split, loaded, data, json_path, predictions_path)
            if reference is not None:  # (the reference model's folder of results/eval/ is named after it)
                theirs = Path(reference) / Path(predictions_path).name
                compare = importlib.import_module(REFERENCE_MODULE).with_reference
                result = compare(json_path, predictions_path, theirs, Path(reference).name)
            results.append(result)
    return results


def load(model_dir: Path) -> Loaded:
    """The model of ``model_dir`` on the job's device (its files checked against its manifest)."""
    device = pick_device()
    manifest = read_json(model_dir / "manifest.json")
    model = load_trained(model_dir).to(device)
    return Loaded(
        model=model,
        tokenizer=load_tokenizer(str(model_dir)),
        classes=read_json(model_dir / "labels.json"),
        max_length=manifest["config"]["max_length"],
        device=device,
        params=count_parameters(model),
        train_time_s=read_json(model_dir / "metrics.json").get("train_time_s"),
        gold_labels=manifest.get("gold_labels"),
        transfer_rows=(manifest.get("rows") or {}).get("transfer", 0),
    )


def evaluate_split(
    settings: EvalSettings, split: str, loaded: Loaded, data_dir: Path, out_json: Path, out_predictions: Path
) -> tuple[dict, Predicted]:
    """The metrics and predictions of ``split``."""
    frame = restrict_to_domain(
        read_split(data_dir, split), settings.domain, dataset_domains(data_dir), f"evaluate {settings.model}"
    )
    frame = frame[frame["label"].isin(loaded.classes)].reset_index(drop=True)
    local = {c: i for i, c in enumerate(loaded.classes)}
    y = frame["label"].map(local).to_numpy(dtype=np.int64)
    frame, member_probs, mc_probs, extra = _predict(settings, split, loaded, frame, y)
    result = write_evaluation(
        settings,
        split,
        member_probs,
        y,
        loaded.classes,
        frame["row_id"].to_numpy(),
        extra,
        out_json,
        out_predictions,
        frame["domain"].to_numpy() if "domain" in frame else None,
        mc_probs,
    )
    return result, (member_probs, mc_probs, result["metrics"]["accuracy"])


def evaluate_ood(
    settings: EvalSettings, loaded: Loaded, ood_dir: Path, test: Predicted, out_json: Path, out_predictions: Path
) -> dict:
    """The OOD rows (every one, whatever its class: none is a class of the model) against the test rows."""
    frame, member_probs, mc_probs, extra = _predict(settings, OOD, loaded, read_split(ood_dir, OOD), None)
    test_probs, test_mc, accuracy = test
    return write_ood(
        settings,
        test_probs,
        member_probs,
        frame,
        loaded.classes,
        extra,
        out_json,
        out_predictions,
        accuracy,
        test_mc,
        mc_probs,
    )


def _predict(settings: EvalSettings, split: str, loaded: Loaded, frame, y) -> tuple:
    """(the frame without its texts, member probabilities [M, N, C], MC-dropout samples [T·M, N, C] or None, what
    the record says of the model and the pass)."""
    encoded = encode_frame(
        loaded.tokenizer,
        frame,
        max_length=loaded.max_length,
        label_ids=y,
        separate_pairs=getattr(loaded.model, "separate_pairs", False),
    )
    frame = without_texts(frame)
    release_freed_memory()
    desc = f"evaluate {settings.model} {split}"
    started = time.perf_counter()
    member_probs = softmax(
        predict_logits(
            loaded.model, encoded, batch_size=settings.batch_size, device=loaded.device, desc=desc, members=True
        )
    )
    inference_time = time.perf_counter() - started
    mc_probs = None
    if settings.mc_samples:
        if not any(rate > 0 for rate in dropout_rates(loaded.model)):
            raise KdpipeError(
                f"evaluate.mc_samples: model {settings.model} has no dropout (every dropout probability is 0), so "
                "its MC-dropout samples would all be equal; leave evaluate.mc_samples out"
            )
        mc_probs = softmax(
            mc_member_logits(
                loaded.model,
                encoded,
                samples=settings.mc_samples,
                seed=settings.mc_seed,
                batch_size=settings.batch_size,
                device=loaded.device,
                desc=desc,
            )
        )
    extra = {
        "params": loaded.params,
        "train_time_s": loaded.train_time_s,
        "inference_time_s": inference_time,
        "device": getattr(loaded.model, "runs_on", None) or _describe(loaded.device),  # (an ONNX graph: its own)
        "batch_size": settings.batch_size,
        "gold_labels": loaded.gold_labels,
        "transfer_rows": loaded.transfer_rows,
    }
    return frame, member_probs, mc_probs, extra


def _describe(device) -> str:
    """The device as the cost plot states it: the GPU's name, or the CPU threads inference used."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}"
