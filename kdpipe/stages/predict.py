"""The ``predict`` command: labels and class probabilities of any model kdpipe saved (teacher or student: a Hugging
Face classifier, a multi-head or a BiLSTM student) for every row of an unlabelled CSV/TSV/JSONL/Parquet file.

    kdpipe predict --model results/students/muki --input new.csv --out predicted.csv [--text-column review]

Rows are tokenised as kdpipe evaluated the model and written in the input's order: the input's columns, then
``label`` (the predicted class), ``score`` (its probability) and ``prob_<class>`` for every class, in the format of
the ``--out`` extension (docs/your-own-models-and-data.md, "Using a trained student").
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.device import pick_device
from kdpipe.core.settings import Settings, from_schema
from kdpipe.core.store import KdpipeError, atomic_path, read_json
from kdpipe.data.batching import encode
from kdpipe.data.files import read_table
from kdpipe.data.text_readers import _not_text
from kdpipe.models.inference import predict_logits, softmax
from kdpipe.models.loading import load_tokenizer, load_trained


@dataclass(frozen=True)
class PredictSettings(Settings):
    """What ``--params`` may set for ``kdpipe predict`` (the options win); ``max_length`` left out: the model's
    own."""

    text_column: str = from_schema("dataset", "text_column")
    text_pair_column: str | None = from_schema("dataset", "text_pair_column")
    batch_size: int = from_schema("evaluate", "batch_size")
    max_length: int | None = None
    format: str = from_schema("dataset", "format")
    encoding: str = from_schema("dataset", "encoding")


WRITERS = {
    ".csv": lambda frame, path: frame.to_csv(path, index=False),
    ".tsv": lambda frame, path: frame.to_csv(path, sep="\t", index=False),
    ".jsonl": lambda frame, path: frame.to_json(path, orient="records", lines=True, force_ascii=False),
    ".parquet": lambda frame, path: frame.to_parquet(path, index=False),
}


def run(
    settings: PredictSettings,
    model: Path,
    input: Path,
    out: Path,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    batch_size: str | None = None,
    encoding: str | None = None,
) -> pd.DataFrame:
    """Predict every row of ``input`` with the model folder ``model``; write ``out``. Options may also come in
    ``settings`` (``text_column``, ``text_pair_column``, ``batch_size``, ``max_length``, ``format``, ``encoding``)."""
    encoding = encoding or settings.encoding
    model_dir, out = Path(model), Path(out)
    if out.suffix.lower() not in WRITERS:
        raise KdpipeError(f"--out {out}: unknown extension '{out.suffix}'; use one of {', '.join(WRITERS)}")
    if not (model_dir / "labels.json").is_file() or not (model_dir / "manifest.json").is_file():
        raise KdpipeError(
            f"--model {model_dir}: not a model folder kdpipe wrote (no labels.json and manifest.json); give a folder "
            "under results/teachers/ or results/students/"
        )
    text_column = text_column or settings.text_column
    text_pair_column = text_pair_column or settings.text_pair_column
    frame = read_table(input, "--input", fmt=settings.format, encoding=encoding, encoding_option="--encoding")
    for option, column in (("--text-column", text_column), ("--text-pair-column", text_pair_column)):
        if column is not None and column not in frame.columns:
            raise KdpipeError(f"{input}: no column '{column}' ({option}); the columns are {list(frame.columns)}")
    texts = _texts(frame, text_column, "--text-column", input)
    pairs = _texts(frame, text_pair_column, "--text-pair-column", input) if text_pair_column else None
    classes = read_json(model_dir / "labels.json")
    max_length = int(settings.max_length or read_json(model_dir / "manifest.json")["config"]["max_length"])
    net = load_trained(model_dir)
    encoded = encode(
        load_tokenizer(str(model_dir)),
        texts,
        pairs,
        max_length=max_length,
        separate_pairs=getattr(net, "separate_pairs", False),
    )
    device = pick_device()
    batch_size = int(batch_size or settings.batch_size)
    logits = predict_logits(net.to(device), encoded, batch_size=batch_size, device=device, desc="predict", members=True)
    probs = softmax(logits).mean(axis=0)  # [members, N, C]: a multi-head model's heads, as kdpipe evaluates it
    result = frame.copy()
    result["label"] = np.asarray(classes)[probs.argmax(1)]
    result["score"] = probs.max(1)
    for i, name in enumerate(classes):
        result[f"prob_{name}"] = probs[:, i]
    with atomic_path(out) as tmp:
        WRITERS[out.suffix.lower()](result, tmp)
    print(f"[kdpipe] predicted {len(result)} rows with {model_dir}: {out}")
    return result


def _texts(frame: pd.DataFrame, column: str, option: str, input: Path) -> list[str]:
    """The texts of ``column``, each a single value: a missing cell, a list, an object or bytes stops the command
    with one line naming the file, the column and the first such row. Every NUL character becomes a space (a
    tokenizer would drop it, joining the words beside it), said with counts on stderr when there are any."""
    values = frame[column]
    kinds = values.map(_not_text).where(~values.isna(), "no text (a missing value)")
    bad = np.flatnonzero(kinds.notna().to_numpy())
    if len(bad):
        more = f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""
        raise KdpipeError(
            f"{input}: data row {bad[0] + 1} (counting from 1) has {kinds.iloc[bad[0]]} in column '{column}' "
            f"({option}){more}; every row needs a text to predict from: fill it in or leave the row out"
        )
    texts = values.astype(str)
    counts = texts.str.count("\x00")
    if counts.any():
        print(
            f"[kdpipe] predict: {int(counts.sum()):,} NUL characters in {int((counts > 0).sum()):,} rows of column "
            f"{column!r} read as spaces",
            file=sys.stderr,
        )
        texts = texts.str.replace("\x00", " ", regex=False)
    return texts.tolist()
