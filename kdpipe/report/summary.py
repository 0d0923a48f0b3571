"""The report's table of runs: evaluation JSONs read and checked, grouped over seeds, with pooled reliability,
uncertainty and per-domain accuracy, and the AURC of selective prediction where evaluations have it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.store import KdpipeError
from kdpipe.evaluation.metrics import total_variation
from kdpipe.report.intervals import accuracy_interval

REQUIRED_FIELDS = ("model", "base", "kind", "method", "seed", "split", "params", "train_time_s", "classes", "metrics")
REQUIRED_METRICS = ("accuracy", "macro_f1", "nll", "ece", "brier", "reliability")
REQUIRED_BINS = ("bin_edges", "count", "confidence", "accuracy")
UNCERTAINTY_PARTS = ("total", "aleatoric", "epistemic")
REQUIRED_UNCERTAINTY = (*UNCERTAINTY_PARTS, "bin_edges", "hist")
REQUIRED_CURVE = ("score", "coverage", "risk")
TABLE_METRICS = ("accuracy", "macro_f1", "nll", "ece", "brier")
# Summary column of each part's mean over examples: the total uncertainty is the mean predictive entropy.
UNCERTAINTY_MEANS = {"total": "entropy", "aleatoric": "aleatoric", "epistemic": "epistemic"}
UNCERTAINTY_COLUMNS = (*UNCERTAINTY_MEANS.values(), *(f"tv_{part}" for part in UNCERTAINTY_PARTS))
# Columns that differ between seeds and so get a mean and a std (params and members do not).
AVERAGED = (*TABLE_METRICS, "train_time_s", *UNCERTAINTY_COLUMNS, "inference_time_s", "inference_ms")
TSV_COLUMNS = (
    "split", "model", "kind", "method", "domain", "classes", "gold_labels", "seeds", "params", "members",
    *(name for column in AVERAGED for name in (column, f"{column}_std")),
)  # fmt: skip
# The AURC of the maximum probability (metrics.selective): columns of summary.tsv only when some evaluation has it.
SELECTIVE_COLUMNS = ("aurc", "aurc_std")
SELECTIVE_SCORE = "max_prob"
SPLIT_ORDER = ("test", "validation")
KIND_ORDER = ("teacher", "ensemble", "oracle", "student")


def check_eval(record: dict, path: str | Path) -> dict:
    """``record``, the evaluation JSON read from ``path``, checked for every field the report uses, with its source."""
    missing = [f for f in REQUIRED_FIELDS if f not in record]
    metrics = record.get("metrics") or {}
    missing += [f"metrics.{f}" for f in REQUIRED_METRICS if metrics.get(f) is None]
    if isinstance(metrics.get("reliability"), dict):
        missing += [f"metrics.reliability.{f}" for f in REQUIRED_BINS if f not in metrics["reliability"]]
    uncertainty = metrics.get("uncertainty")
    if isinstance(uncertainty, dict):
        missing += [f"metrics.uncertainty.{f}" for f in REQUIRED_UNCERTAINTY if uncertainty.get(f) is None]
        if isinstance(uncertainty.get("hist"), dict):
            missing += [f"metrics.uncertainty.hist.{f}" for f in UNCERTAINTY_PARTS if f not in uncertainty["hist"]]
    selective = metrics.get("selective")
    if isinstance(selective, dict):
        missing += [f"metrics.selective.{f}" for f in ("aurc", "curve") if not isinstance(selective.get(f), dict)]
        if isinstance(selective.get("curve"), dict):
            missing += [f"metrics.selective.curve.{f}" for f in REQUIRED_CURVE if selective["curve"].get(f) is None]
    if missing:
        raise KdpipeError(f"{path}: evaluation lacks field(s) {', '.join(missing)}; re-run its evaluate job")
    if not record["classes"]:
        raise KdpipeError(f"{path}: evaluation has an empty 'classes' list")
    return {**record, "source": str(path)}


def runs_table(records: list[dict]) -> pd.DataFrame:
    """One row per evaluation file, metrics flattened into columns, in input order (optional fields NaN or None),
    with the TV distances to each run's reference."""
    runs = pd.DataFrame(
        [
            {
                "source": r["source"],
                "model": r["model"],
                "base": r["base"],
                "kind": r["kind"],
                "method": r["method"],
                "domain": r.get("domain"),
                "group": r.get("group"),
                "per_domain": r["metrics"].get("per_domain"),
                "split": r["split"],
                "n_classes": len(r["classes"]),
                "class_names": tuple(r["classes"]),
                "reference": r.get("reference"),
                "gold_labels": describe_label_use(r.get("gold_labels"), r.get("transfer_rows")),
                "transfer_rows": r.get("transfer_rows") or 0,
                "params": r["params"],
                "members": r.get("members"),
                "train_time_s": r["train_time_s"],
                "inference_time_s": r.get("inference_time_s"),
                # per example, for the cost plot: the split's rows differ between full-label and subset models
                "inference_ms": _per_example_ms(r.get("inference_time_s"), r["metrics"].get("n")),
                "device": r.get("device"),
                "batch_size": r.get("batch_size"),
                "per_class": r["metrics"].get("per_class_accuracy"),
                **{m: r["metrics"][m] for m in TABLE_METRICS},
                "reliability": r["metrics"]["reliability"],
                **{c: (r["metrics"].get("uncertainty") or {}).get(p, np.nan) for p, c in UNCERTAINTY_MEANS.items()},
                "uncertainty": r["metrics"].get("uncertainty"),
                "aurc": ((r["metrics"].get("selective") or {}).get("aurc") or {}).get(SELECTIVE_SCORE),
                "selective": r["metrics"].get("selective"),
            }  # fmt: skip
            for r in records
        ]
    )
    duplicated = runs[runs.duplicated(["model", "split"], keep=False)]
    if not duplicated.empty:
        raise KdpipeError(
            f"report: model '{duplicated['model'].iloc[0]}' on split '{duplicated['split'].iloc[0]}' is given "
            f"more than once: {', '.join(duplicated['source'])}"
        )
    distances = [_distances(run, _reference(run, runs)) for run in runs.itertuples(index=False)]
    runs = runs.assign(**{f"tv_{part}": [d[part] for d in distances] for part in UNCERTAINTY_PARTS})
    for column in ("params", "members", "aurc", *AVERAGED):
        runs[column] = pd.to_numeric(runs[column]).astype(float)
    return runs


def _reference(run, runs: pd.DataFrame):
    """The ensemble of the run's split and classes whose uncertainty histograms ``run`` is compared with, or None:
    the one its ``reference`` field names, itself for an ensemble, else the only candidate."""
    if run.uncertainty is None:
        return None
    ensembles = runs[
        (runs["kind"] == "ensemble") & (runs["split"] == run.split) & runs["uncertainty"].notna()
        & runs["class_names"].map(lambda names: names == run.class_names)
    ]  # fmt: skip
    name = run.reference if pd.notna(run.reference) else run.model if run.kind == "ensemble" else None
    if name is not None:
        named = ensembles[ensembles["model"] == name]
        if named.empty:
            raise KdpipeError(
                f"report: {run.source} names '{name}' as its reference, but no ensemble of that name with uncertainty "
                f"fields was evaluated on split '{run.split}' with the same classes"
            )
        return named.iloc[0]
    if len(ensembles) > 1:
        raise KdpipeError(
            f"report: {run.source} could be compared with ensembles {', '.join(ensembles['model'])} on split "
            f"'{run.split}'; name one in its 'reference' field"
        )
    return ensembles.iloc[0] if len(ensembles) else None


def _distances(run, reference) -> dict:
    """Total variation distance per uncertainty part between the histograms of ``run`` and ``reference``."""
    if reference is None:
        return dict.fromkeys(UNCERTAINTY_PARTS, np.nan)
    edges = [run.uncertainty["bin_edges"], reference.uncertainty["bin_edges"]]
    _common_edges([run.model, reference.model], edges, "uncertainty bins")
    hists = run.uncertainty["hist"], reference.uncertainty["hist"]
    return {part: total_variation(hists[0][part], hists[1][part]) for part in UNCERTAINTY_PARTS}


def describe_label_use(use: dict | None, transfer_rows: int | None = None) -> str:
    """The gold labels a model read to be made, in words for the tables ("none", "train 1,489 · validation 213",
    "router: validation 213", "not recorded"...), then the transfer rows it learnt from, if any (docs/report.md,
    "Which gold labels each model read")."""
    transfer = f" + {transfer_rows:,} transfer rows without labels" if transfer_rows else ""
    if use is None:
        return "not recorded" + transfer
    if not use:
        return "none" + transfer
    order = {"train": 0, "validation": 1, "router: train": 2, "router: validation": 3, "test": 4}
    parts = [
        f"{split} {rows:,}" if isinstance(rows, int) else f"{split}: {rows}"
        for split, rows in sorted(use.items(), key=lambda item: order.get(item[0], 5))
    ]
    return " · ".join(parts) + transfer


def summarise(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per (split, base model): seeds as mean/std, ordered test first, teachers first, then input order."""
    total_classes = runs["n_classes"].max()
    rows = []
    for (split, base), group in runs.groupby(["split", "base"], sort=False):
        for column in ("kind", "method", "n_classes"):
            if group[column].nunique(dropna=False) > 1:
                raise KdpipeError(
                    f"report: models {', '.join(group['model'])} share the base name '{base}' but differ in "
                    f"'{column}' ({', '.join(map(str, group[column].unique()))})"
                )
        first = group.iloc[0]
        low, high = accuracy_interval(list(group["source"]))
        rows.append(
            {
                "split": split,
                "model": base,
                "kind": first["kind"],
                "method": first["method"],
                "domain": first["domain"],
                "group": first["group"],
                "per_domain": _pool_domains(group),
                "n_classes": first["n_classes"],
                "classes": f"{first['n_classes']}/{total_classes}",
                "gold_labels": " / ".join(dict.fromkeys(group["gold_labels"])),  # the seeds' (one when they agree)
                "seeds": len(group),
                "params": first["params"],
                "members": first["members"],
                **{c: group[c].mean() for c in AVERAGED},
                **{f"{c}_std": group[c].std(ddof=1) for c in AVERAGED},
                "accuracy_low": low,
                "accuracy_high": high,
                "aurc": group["aurc"].mean(),
                "aurc_std": group["aurc"].std(ddof=1),
                "reliability": _pool_reliability(group),
                "uncertainty": _pool_uncertainty(group),
                "per_class": _pool_per_class(group),
                "sources": list(group["source"]),
                "device": first["device"],
                "batch_size": first["batch_size"],
            }  # fmt: skip
        )
    summary = pd.DataFrame(rows)
    for column in ("params", "members"):
        summary[column] = summary[column].round().astype("Int64")
    splits = [s for s in SPLIT_ORDER if s in set(summary["split"])]
    splits += [s for s in summary["split"].unique() if s not in splits]
    rank = {
        "split": summary["split"].map(splits.index),
        "kind": summary["kind"].map(lambda k: KIND_ORDER.index(k) if k in KIND_ORDER else len(KIND_ORDER)),
    }
    order = pd.DataFrame(rank).sort_values(["split", "kind"], kind="stable").index
    return summary.loc[order].reset_index(drop=True)


def _per_example_ms(seconds: float | None, rows: int | None) -> float:
    return np.nan if seconds is None or not rows else 1000.0 * seconds / rows


def _pool_per_class(group: pd.DataFrame) -> dict | None:
    """{class: mean over the seeds of the accuracy on that class's rows}, or None without per-class metrics."""
    records = [r for r in group["per_class"] if r]
    if not records:
        return None
    pooled = {c: [r[c] for r in records if r.get(c) is not None] for c in records[0]}
    # (a class without rows in the split has no accuracy: None, as classification_metrics gives it)
    return {c: float(np.mean(values)) if values else None for c, values in pooled.items()}


def _pool_domains(group: pd.DataFrame) -> dict | None:
    """{domain: (mean, std) of the seeds' accuracy on that domain's rows}, or None without per-domain metrics."""
    records = [r for r in group["per_domain"] if r]
    if not records:
        return None
    domains = sorted(set().union(*records))
    accuracy = {d: pd.Series([r[d]["accuracy"] for r in records if d in r], dtype=float) for d in domains}
    return {d: (values.mean(), values.std(ddof=1)) for d, values in accuracy.items()}


def _pool_reliability(group: pd.DataFrame) -> dict:
    """The seeds' reliability bins merged: counts add, per-bin confidence/accuracy are count-weighted means."""
    bins = list(group["reliability"])
    edges = _common_edges(group["model"], [b["bin_edges"] for b in bins], "reliability bins")
    count = np.sum([b["count"] for b in bins], axis=0).astype(float)

    def pooled(key: str) -> np.ndarray:
        # Empty bins hold None (NaN here) and count 0: they add nothing to the weighted sum.
        weighted = [np.nan_to_num(np.asarray(b[key], dtype=float)) * np.asarray(b["count"]) for b in bins]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(weighted, axis=0) / count

    return {"bin_edges": edges, "count": count, "confidence": pooled("confidence"), "accuracy": pooled("accuracy")}


def _pool_uncertainty(group: pd.DataFrame) -> dict | None:
    """The seeds' uncertainty histograms summed per part, or None when no seed has uncertainty fields."""
    group = group[group["uncertainty"].notna()]
    if group.empty:
        return None
    summaries = list(group["uncertainty"])
    edges = _common_edges(group["model"], [u["bin_edges"] for u in summaries], "uncertainty bins")
    hist = {part: np.sum([u["hist"][part] for u in summaries], axis=0).astype(float) for part in UNCERTAINTY_PARTS}
    return {"bin_edges": edges, "hist": hist}


def _common_edges(models, edges: list, what: str) -> np.ndarray:
    """The bin edges that ``models`` (one list of edges each) share; an error naming them when they differ."""
    first = np.asarray(edges[0], dtype=float)
    if any(len(e) != len(first) or not np.allclose(e, first) for e in edges[1:]):
        raise KdpipeError(f"report: {', '.join(models)} were evaluated with different {what}")
    return first


def tsv_columns(summary: pd.DataFrame) -> tuple[str, ...]:
    """The columns of summary.tsv: :data:`TSV_COLUMNS`, then the AURC and its std when some evaluation has it."""
    return (*TSV_COLUMNS, *(SELECTIVE_COLUMNS if has_selective(summary) else ()))


def has_selective(summary: pd.DataFrame) -> bool:
    """Some evaluation has the AURC of its maximum probability (``metrics.selective``)."""
    return bool(summary["aurc"].notna().any())


def has_members(summary: pd.DataFrame) -> bool:
    """Some model averages several members or heads: only then does an uncertainty split say anything."""
    return bool((summary["members"].fillna(1) > 1).any())


def comparable(summary: pd.DataFrame) -> np.ndarray:
    """The models whose scores compete: those of the full label space, not the teachers' oracle (it reads the gold
    labels)."""
    return ((summary["n_classes"] == summary["n_classes"].max()) & (summary["kind"] != "oracle")).to_numpy()
