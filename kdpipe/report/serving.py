"""The report's serving table, from the serving profiles of model folders (kdpipe.models.serving): each model's
batch-1 latency, throughput, memory and size, its speed-up against the teacher side beside the accuracy it kept
(docs/report.md, "Serving profiles"), as ``serving.tsv`` and ``serving.md``; and the summary with each profiled
model's batch-1 latency in place of its evaluation-time inference time per example, for the cost plot
(kdpipe.report.cost).

The *teacher side* is what the students replace: the profiled teachers, one after another (a request to teachers on
disjoint classes goes to each of them), so its latency is the sum of their median latencies. Its accuracy is the
accuracy of one model of the summary: the teacher when there is one of the full label space, else the teachers'
oracle (the ceiling of teachers on class subsets), unless the caller names another.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError, atomic_path, read_json
from kdpipe.report.markdown import plain

REQUIRED = ("model", "format", "precision", "latency_ms", "throughput", "memory", "size", "threads", "device")
TSV_COLUMNS = (
    "model", "kind", "format", "precision", "latency_ms", "latency_p95_ms", "throughput", "batch_size", "speedup",
    "accuracy", "accuracy_kept", "peak_rss_mb", "model_mb", "weights_mb", "threads", "device",
)  # fmt: skip
MARKDOWN_HEAD = (
    "model", "format", "latency (ms), median", "p95", "texts/s", "speed-up", "accuracy (%)", "kept (%)",
    "peak memory (MB)", "weights (MB)",
)  # fmt: skip
NOTE = (
    "One row per profiled model folder. A request is one text in, class probabilities out, tokenisation "
    "included. Latency: batch 1, median and 95th percentile over the profiled texts after a warm-up; texts/s: "
    "throughput at the batch size shown in serving.tsv. Speed-up: the teacher side's median latency (its teachers "
    "one after another) over the model's. Accuracy: on the test split, from the model's evaluation (a model with "
    "seeds: the mean over its seeds); kept: as a "
    "share of the teacher side's accuracy ({reference}). Peak memory: the peak resident set of the process that "
    "served the model alone, libraries included. Weights: the weights file on disk."
)


def check_profile(profile: dict, path: str | Path) -> dict:
    """A serving profile, checked for every field the report reads, with its ``source``."""
    missing = [f for f in REQUIRED if f not in profile]
    missing += [f"latency_ms.{f}" for f in ("median", "p95") if f not in (profile.get("latency_ms") or {})]
    if missing:
        raise KdpipeError(f"{path}: serving profile lacks field(s) {', '.join(missing)}; profile the model again")
    return {**profile, "source_file": str(path)}


def read_profiles(paths: list[str | Path]) -> list[dict]:
    """The checked profiles of ``paths``; two profiles of one model stop the report, naming both files."""
    profiles = [check_profile(read_json(path), path) for path in paths]
    seen: dict[str, str] = {}
    for profile in profiles:
        if profile["model"] in seen:
            raise KdpipeError(
                f"report: model '{profile['model']}' has two serving profiles: {seen[profile['model']]}, "
                f"{profile['source_file']}"
            )
        seen[profile["model"]] = profile["source_file"]
    return profiles


def summary_name(model: str) -> str:
    """The summary's row of a profiled model: its name without a seed (``s.seed2.int8`` is a row of ``s.int8``,
    whose accuracy is the mean over its seeds)."""
    return re.sub(r"\.seed\d+(?=\.|$)", "", model)


def _accuracy(summary: pd.DataFrame | None) -> dict[str, float]:
    """Each model's accuracy on the summary's first split (the test split when there is one)."""
    if summary is None or summary.empty:
        return {}
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    return dict(zip(shown["model"], shown["accuracy"].astype(float)))


def reference_model(summary: pd.DataFrame | None, teachers: list[str]) -> str | None:
    """The model whose accuracy stands for the teacher side: a single profiled teacher of the full label space,
    else the teachers' oracle, else none."""
    if summary is None or summary.empty:
        return None
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    full = shown[shown["n_classes"] == shown["n_classes"].max()]
    if len(teachers) == 1 and teachers[0] in set(full["model"]):
        return teachers[0]
    oracle = full[full["kind"] == "oracle"]
    return oracle["model"].iloc[0] if len(oracle) else None


def serving_table(
    profiles: list[dict],
    summary: pd.DataFrame | None = None,
    *,
    teachers: list[str] | None = None,
    reference: str | None = None,
) -> pd.DataFrame:
    """One row per profile, the teacher side first: latency, throughput, memory, size, ``speedup`` (the teacher
    side's median latency over the model's) and ``accuracy_kept`` (the model's accuracy over ``reference``'s, the
    model of the summary that stands for the teacher side: :func:`reference_model` by default). ``teachers``: the
    profiled models of the teacher side (by default those of kind ``teacher``)."""
    names = [p["model"] for p in profiles]
    teachers = list(teachers) if teachers is not None else [p["model"] for p in profiles if p.get("kind") == "teacher"]
    unknown = [t for t in teachers if t not in names]
    if unknown:
        raise KdpipeError(f"report: no serving profile of the teacher(s) {', '.join(unknown)}")
    latency = {p["model"]: float(p["latency_ms"]["median"]) for p in profiles}
    teacher_latency = sum(latency[t] for t in teachers) if teachers else np.nan
    accuracy = _accuracy(summary)
    reference = reference if reference is not None else reference_model(summary, teachers)
    reference_accuracy = accuracy.get(reference, np.nan) if reference else np.nan
    rows = []
    for profile in sorted(profiles, key=lambda p: p["model"] not in teachers):  # (stable: the teachers first)
        model = profile["model"]
        rows.append(
            {
                "model": model,
                "kind": profile.get("kind"),
                "format": profile["format"],
                "precision": profile["precision"],
                "latency_ms": latency[model],
                "latency_p95_ms": float(profile["latency_ms"]["p95"]),
                "throughput": float(profile["throughput"]["texts_per_s"]),
                "batch_size": int(profile["throughput"]["batch_size"]),
                "speedup": teacher_latency / latency[model],
                "accuracy": accuracy.get(summary_name(model), np.nan),
                "accuracy_kept": accuracy.get(summary_name(model), np.nan) / reference_accuracy,
                "peak_rss_mb": float(profile["memory"]["peak_rss_mb"]),
                "model_mb": float(profile["memory"].get("model_mb", np.nan)),
                "weights_mb": float(profile["size"]["weights_mb"]),
                "threads": profile["threads"],
                "device": profile["device"],
            }
        )
    table = pd.DataFrame(rows, columns=list(TSV_COLUMNS))
    table.attrs["reference"] = reference
    table.attrs["teachers"] = teachers
    return table


def _number(value: float, digits: int, scale: float = 1.0, suffix: str = "") -> str:
    return "—" if pd.isna(value) else f"{value * scale:,.{digits}f}{suffix}"


def serving_markdown(table: pd.DataFrame) -> str:
    """``serving.md``: the table, rounded for reading, and what its columns mean."""
    lines = ["| " + " | ".join(MARKDOWN_HEAD) + " |", "| --- | --- |" + " ---: |" * (len(MARKDOWN_HEAD) - 2)]
    for row in table.itertuples(index=False):
        cells = [
            plain(row.model),
            f"{row.format} {row.precision}",
            _number(row.latency_ms, 2),
            _number(row.latency_p95_ms, 2),
            _number(row.throughput, 1),
            _number(row.speedup, 2, suffix="x"),
            _number(row.accuracy, 1, 100),
            _number(row.accuracy_kept, 1, 100),
            _number(row.peak_rss_mb, 0),
            _number(row.weights_mb, 1),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    teachers = ", ".join(plain(t) for t in table.attrs.get("teachers") or []) or "none profiled"
    reference = plain(table.attrs.get("reference") or "none")
    devices = "; ".join(sorted({f"{d}, {t} thread{'s' if t != 1 else ''}" for d, t in
                                zip(table["device"], table["threads"])}))  # fmt: skip
    return "\n".join(
        [
            "# Serving profiles",
            "",
            *lines,
            "",
            NOTE.format(reference=reference) + f" Teacher side: {teachers}. Measured on: {plain(devices)}.",
            "",
        ]
    )


SERVING_OUTPUTS = ("serving.tsv", "serving.md")


def write_serving(table: pd.DataFrame, out_dir: str | Path) -> None:
    """``serving.tsv`` (every column) and ``serving.md`` in ``out_dir``."""
    out_dir = Path(out_dir)
    with atomic_path(out_dir / "serving.tsv") as tmp:
        table[list(TSV_COLUMNS)].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    with atomic_path(out_dir / "serving.md") as tmp:
        tmp.write_text(serving_markdown(table))


def with_serving_latency(summary: pd.DataFrame, profiles: list[dict]) -> pd.DataFrame:
    """``summary`` with ``inference_ms`` the median batch-1 latency of every profiled model (the evaluation's
    inference time per example for the others) and ``time_source`` saying which (``profile``, ``evaluation``), for
    the cost plot."""
    latency = {summary_name(p["model"]): float(p["latency_ms"]["median"]) for p in profiles}
    device = {
        summary_name(p["model"]): f"{p['device']}, {p['threads']} thread{'s' if p['threads'] != 1 else ''}"
        for p in profiles
    }
    out = summary.copy()
    profiled = out["model"].isin(latency)
    if profiled.any():
        out.loc[profiled, "inference_ms"] = out.loc[profiled, "model"].map(latency).astype(float)
    out["time_source"] = np.where(profiled, "profile", "evaluation")
    out["profile_device"] = out["model"].map(device)
    return out
