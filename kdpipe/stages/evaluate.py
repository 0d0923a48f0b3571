"""The ``evaluate`` stage: metrics and predictions of one trained model on every split it is evaluated on.

One job per model (docs/caching-and-reruns.md, "Rerun rules"): the model is loaded once, then each split is read,
tokenised, predicted and written in turn, exactly as a job of that split alone would write it.

A trained model (teacher or student). A subset teacher is evaluated on the rows of its own classes
(its label space), a model trained for one ``domain`` on that domain's rows; every other model on all rows. When
the data has domains, the JSON also gives each domain's accuracy (``metrics.per_domain``), so a model of all
domains can be compared with per-domain students on each domain's rows.

Every model gets the uncertainty split of docs/methods.md §3 (total = entropy of the mean prediction, aleatoric = mean
member entropy, epistemic = their difference, the mutual information) over its members: the heads of a multi-head
student, the members of an ensemble, or the model itself (M = 1, epistemic 0).

Outputs per split (:mod:`kdpipe.evaluation.results`): ``{split}.json`` and ``{split}.predictions.parquet`` (row_id,
label, pred, correct, confidence, probs, and the per-row total / aleatoric / epistemic uncertainty).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kdpipe.core.device import pick_device
from kdpipe.core.memory import release_freed_memory
from kdpipe.core.store import read_json
from kdpipe.data.batching import encode_frame, without_texts
from kdpipe.data.dataset import dataset_domains, read_split, restrict_to_domain
from kdpipe.evaluation.results import split_slices, write_evaluation
from kdpipe.models.inference import predict_member_logits, softmax
from kdpipe.models.loading import count_parameters, load_tokenizer, load_trained


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


def run(params: dict, model: Path, data: Path, out_json: list[Path], out_predictions: list[Path]) -> list[dict]:
    """``params``: model (name), base, kind, method, seed, splits, batch_size, ece_bins (and domain); ``out_json``
    and ``out_predictions``: one path per split, in the order of ``splits``."""
    loaded = load(Path(model))
    evaluated = zip(split_slices(params), out_json, out_predictions, strict=True)
    return [evaluate_split(split_params, loaded, data, *paths) for split_params, *paths in evaluated]


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


def evaluate_split(params: dict, loaded: Loaded, data_dir: Path, out_json: Path, out_predictions: Path) -> dict:
    """One split's metrics and predictions (``params``: the split's slice, with ``split``)."""
    frame = restrict_to_domain(
        read_split(data_dir, params["split"]),
        params.get("domain"),
        dataset_domains(data_dir),
        f"evaluate {params['model']}",
    )
    frame = frame[frame["label"].isin(loaded.classes)].reset_index(drop=True)
    local = {c: i for i, c in enumerate(loaded.classes)}
    y = frame["label"].map(local).to_numpy(dtype=np.int64)
    encoded = encode_frame(
        loaded.tokenizer,
        frame,
        max_length=loaded.max_length,
        label_ids=y,
        separate_pairs=getattr(loaded.model, "separate_pairs", False),
    )
    frame = without_texts(frame)
    release_freed_memory()
    started = time.perf_counter()
    member_probs = softmax(
        predict_member_logits(
            loaded.model,
            encoded,
            batch_size=params["batch_size"],
            device=loaded.device,
            desc=f"evaluate {params['model']} {params['split']}",
        )
    )
    inference_time = time.perf_counter() - started
    extra = {
        "params": loaded.params,
        "train_time_s": loaded.train_time_s,
        "inference_time_s": inference_time,
        "device": _describe(loaded.device),
        "batch_size": params["batch_size"],
        "gold_labels": loaded.gold_labels,
        "transfer_rows": loaded.transfer_rows,
    }
    return write_evaluation(
        params,
        member_probs,
        y,
        loaded.classes,
        frame["row_id"].to_numpy(),
        extra,
        out_json,
        out_predictions,
        frame["domain"].to_numpy() if "domain" in frame else None,
    )


def _describe(device) -> str:
    """The device as the cost plot states it: the GPU's name, or the CPU threads inference used."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}"
