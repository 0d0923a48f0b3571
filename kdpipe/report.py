"""The report stage: compare every evaluated model in tables (summary.tsv, summary.md) and plots (reliability.png,
metrics.png, uncertainty.png), from the per-model evaluation JSONs written by the evaluate stage.

A row of the summary is one base model on one split; the seeds of a base model (``vkd.seed1``, ``vkd.seed2``...)
are summarised by their mean and sample standard deviation (ddof=1), because seed variation is the yardstick a
difference between methods has to beat. Reliability diagrams pool the seeds' bins (count-weighted), which is the
diagram of all their predictions together; their titles show the mean ECE of the table, so numbers agree.

Evaluations may carry an uncertainty split (METHODS.md §3): mean total, aleatoric and epistemic uncertainty and
histograms of their per-example values. Each run's histograms are compared with those of its reference ensemble
(kind "ensemble", same split and classes) by total variation distance; the seeds' distances are then averaged like
any metric, and uncertainty.png draws the seeds' pooled histograms. Older evaluations without these fields get blank
cells.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.metrics import total_variation
from kdpipe.store import KdpipeError, atomic_path, read_json

REQUIRED_FIELDS = ("model", "base", "kind", "method", "seed", "split", "params", "train_time_s", "classes", "metrics")
REQUIRED_METRICS = ("accuracy", "macro_f1", "nll", "ece", "brier", "reliability")
REQUIRED_BINS = ("bin_edges", "count", "confidence", "accuracy")
UNCERTAINTY_PARTS = ("total", "aleatoric", "epistemic")
REQUIRED_UNCERTAINTY = (*UNCERTAINTY_PARTS, "bin_edges", "hist")
TABLE_METRICS = ("accuracy", "macro_f1", "nll", "ece", "brier")
# Summary column of each part's mean over examples: the total uncertainty is the mean predictive entropy.
UNCERTAINTY_MEANS = {"total": "entropy", "aleatoric": "aleatoric", "epistemic": "epistemic"}
UNCERTAINTY_COLUMNS = (*UNCERTAINTY_MEANS.values(), *(f"tv_{part}" for part in UNCERTAINTY_PARTS))
# Columns that differ between seeds and so get a mean and a std; params and members are properties of the
# architecture.
AVERAGED = (*TABLE_METRICS, "train_time_s", *UNCERTAINTY_COLUMNS, "inference_time_s")
TSV_COLUMNS = (
    "split", "model", "kind", "method", "domain", "classes", "seeds", "params", "members",
    *(name for column in AVERAGED for name in (column, f"{column}_std")),
)  # fmt: skip
SPLIT_ORDER = ("test", "validation")
KIND_ORDER = ("teacher", "ensemble", "student")

TEACHER_HATCH = "///"
ACCURACY_BAR_COLOUR, GAP_COLOUR = "#7FA7D6", "#C44E52"
METRIC_COLOURS = {"accuracy": "#4C72B0", "macro_f1": "#DD8452", "ece": "#55A868", "nll": "#8172B3"}
UNCERTAINTY_TITLES = {
    "total": "total (predictive entropy)", "aleatoric": "aleatoric (mean member entropy)",
    "epistemic": "epistemic (mutual information)",
}  # fmt: skip
ENSEMBLE_LINESTYLES = ("-", "--", ":", "-.")


def build_report(eval_paths: list[str | Path], out_dir: str | Path) -> None:
    """Write summary.tsv, summary.md, reliability.png and metrics.png for ``eval_paths`` into ``out_dir``, and
    uncertainty.png when a model on the plotted split has uncertainty fields (otherwise a stale one is removed)."""
    if not eval_paths:
        raise KdpipeError("report: no evaluation files given")
    runs = _runs_table([_read_eval(path) for path in eval_paths])
    summary = _summarise(runs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_path(out_dir / "summary.tsv") as tmp:
        summary[list(TSV_COLUMNS)].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    with atomic_path(out_dir / "summary.md") as tmp:
        tmp.write_text(_summary_markdown(summary))
    # Plots show one split (test when there is one): reliability on the validation split says little more.
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    _plot_reliability(shown, out_dir / "reliability.png")
    _plot_metrics(shown, out_dir / "metrics.png")
    if shown["uncertainty"].notna().any():
        _plot_uncertainty(shown, out_dir / "uncertainty.png")
    else:
        # A plot left by an earlier report on other evaluations would contradict the tables.
        (out_dir / "uncertainty.png").unlink(missing_ok=True)


# ---- reading and summarising ---------------------------------------------------------------------------------


def _read_eval(path: str | Path) -> dict:
    """An evaluation JSON, checked for every field the report uses."""
    record = read_json(path)
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
    if missing:
        raise KdpipeError(f"{path}: evaluation lacks field(s) {', '.join(missing)}; re-run its evaluate job")
    if not record["classes"]:
        raise KdpipeError(f"{path}: evaluation has an empty 'classes' list")
    return {**record, "source": str(path)}


def _runs_table(records: list[dict]) -> pd.DataFrame:
    """One row per evaluation file, metrics flattened into columns, in input order; the optional fields (members,
    inference time, uncertainty) NaN or None where missing, and the TV distances to each run's reference."""
    runs = pd.DataFrame(
        [
            {
                "source": r["source"], "model": r["model"], "base": r["base"], "kind": r["kind"],
                "method": r["method"], "domain": r.get("domain"), "group": r.get("group"),
                "per_domain": r["metrics"].get("per_domain"),
                "split": r["split"], "n_classes": len(r["classes"]),
                "class_names": tuple(r["classes"]), "reference": r.get("reference"),
                "params": r["params"], "members": r.get("members"), "train_time_s": r["train_time_s"],
                "inference_time_s": r.get("inference_time_s"),
                **{m: r["metrics"][m] for m in TABLE_METRICS}, "reliability": r["metrics"]["reliability"],
                **_uncertainty_means(r["metrics"].get("uncertainty")), "uncertainty": r["metrics"].get("uncertainty"),
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
    runs = _with_distances(runs)
    for column in ("params", "members", *AVERAGED):
        runs[column] = pd.to_numeric(runs[column]).astype(float)
    return runs


def _uncertainty_means(uncertainty: dict | None) -> dict:
    """The summary columns entropy, aleatoric and epistemic of an evaluation's uncertainty split (None: NaN)."""
    return {column: np.nan if uncertainty is None else uncertainty[part] for part, column in UNCERTAINTY_MEANS.items()}


def _with_distances(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with tv_total, tv_aleatoric and tv_epistemic: each run's histograms against its reference's (NaN
    without uncertainty fields or without a reference)."""
    distances = [_distances(run, _reference(run, runs)) for run in runs.itertuples(index=False)]
    return runs.assign(**{f"tv_{part}": [d[part] for d in distances] for part in UNCERTAINTY_PARTS})


def _reference(run, runs: pd.DataFrame):
    """The ensemble whose uncertainty histograms ``run`` is compared with, or None. Candidates are the ensembles with
    uncertainty fields evaluated on the run's split and classes; the run picks one by name in its optional
    ``reference`` field, an ensemble defaults to itself, and any other run takes the only candidate."""
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


def _summarise(runs: pd.DataFrame) -> pd.DataFrame:
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
        rows.append(
            {
                "split": split, "model": base, "kind": first["kind"], "method": first["method"],
                "domain": first["domain"], "group": first["group"], "per_domain": _pool_domains(group),
                "n_classes": first["n_classes"], "classes": f"{first['n_classes']}/{total_classes}",
                "seeds": len(group), "params": first["params"], "members": first["members"],
                **{c: group[c].mean() for c in AVERAGED},
                **{f"{c}_std": group[c].std(ddof=1) for c in AVERAGED},
                "reliability": _pool_reliability(group), "uncertainty": _pool_uncertainty(group),
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


# ---- Markdown ------------------------------------------------------------------------------------------------

MARKDOWN_HEADER = (
    "model", "kind", "method", "classes", "seeds", "params",
    "accuracy (%)", "macro-F1 (%)", "NLL", "ECE", "Brier", "train time",
)  # fmt: skip
# Optional column groups: shown only when some model has the fields, so older evaluations keep a narrow table.
UNCERTAINTY_HEADER = ("members", "entropy", "aleatoric", "epistemic", "TV total", "TV aleatoric", "TV epistemic")
INFERENCE_HEADER = ("inference time",)
MARKDOWN_LEFT_ALIGNED = {"model", "kind", "method", "trained on"}


def _summary_markdown(summary: pd.DataFrame) -> str:
    """The summary as Markdown: a table per split, mean ± sample std over seeds, rounded for reading."""
    parts = [
        "# Model comparison\n",
        "One row per model; with several seeds, mean ± sample standard deviation over seeds. "
        "Teachers trained on a subset of the classes are evaluated on their own classes only (column *classes*), "
        "so their scores are not directly comparable with full-label-space models.\n",
    ]
    uncertainty = bool(summary["entropy"].notna().any())
    inference = bool(summary["inference_time_s"].notna().any())
    if uncertainty:
        parts.append(
            "Entropy, aleatoric and epistemic: mean per-example uncertainty (nats) over the model's members or heads. "
            "TV: total variation distance between the model's histogram of that uncertainty and its reference "
            "ensemble's (0 = same distribution, 1 = disjoint).\n"
        )
    header = (*MARKDOWN_HEADER, *(UNCERTAINTY_HEADER if uncertainty else ()), *(INFERENCE_HEADER if inference else ()))
    for split, table in summary.groupby("split", sort=False):
        rows = [_markdown_row(row, uncertainty, inference) for row in table.itertuples(index=False)]
        parts.append(f"## {split} split\n\n{_markdown_table(header, rows)}\n")
        if table["per_domain"].notna().any():
            parts.append(_domain_markdown(split, table))
    return "\n".join(parts)


def _domain_markdown(split: str, table: pd.DataFrame) -> str:
    """Accuracy on each domain's rows (METHODS.md §4): models of all domains beside the per-domain students, the
    students of one ``per_domain`` entry (its ``group``) on one row, each in its own domain's column."""
    table = table[table["per_domain"].notna()]
    domains = sorted(set().union(*table["per_domain"]))
    rows = {}
    for row in table.itertuples(index=False):
        name = row.model if pd.isna(row.group) else row.group
        trained = "each domain" if not pd.isna(row.group) else "all domains" if pd.isna(row.domain) else row.domain
        cells = rows.setdefault((name, row.kind, _text(row.method)),
                                {"trained": trained, "seeds": row.seeds, "accuracy": {}})
        cells["accuracy"].update(row.per_domain)
    header = ("model", "kind", "method", "trained on", "seeds", *domains, "mean over domains")
    lines = []
    for (name, kind, method), cells in rows.items():
        accuracy = cells["accuracy"]
        mean = np.mean([accuracy[d][0] for d in domains]) if set(domains) <= set(accuracy) else np.nan
        lines.append([name, kind, method, cells["trained"], str(cells["seeds"]),
                      *(_format_mean_std(*accuracy[d], 1, scale=100) if d in accuracy else "" for d in domains),
                      _format_mean_std(mean, np.nan, 1, scale=100)])
    return (f"### Accuracy (%) per domain, {split} split\n\nEach model on the rows of each domain (mean ± std over "
            "seeds); a per-domain student is evaluated on its own domain only. The last column is the unweighted "
            f"mean of the domains' accuracies.\n\n{_markdown_table(header, lines)}\n")


def _markdown_row(row, uncertainty: bool, inference: bool) -> list[str]:
    """The cells of one model, with the optional column groups that the table shows."""
    cells = [
        str(row.model), str(row.kind), _text(row.method), row.classes,
        str(row.seeds), _format_params(row.params),
        _format_mean_std(row.accuracy, row.accuracy_std, 1, scale=100),
        _format_mean_std(row.macro_f1, row.macro_f1_std, 1, scale=100),
        _format_mean_std(row.nll, row.nll_std, 3),
        _format_mean_std(row.ece, row.ece_std, 3),
        _format_mean_std(row.brier, row.brier_std, 3),
        _format_duration(row.train_time_s, row.train_time_s_std),
    ]  # fmt: skip
    if uncertainty:
        cells.append(_text(row.members))
        cells += [_format_mean_std(getattr(row, c), getattr(row, f"{c}_std"), 3) for c in UNCERTAINTY_COLUMNS]
    if inference:
        cells.append(_format_duration(row.inference_time_s, row.inference_time_s_std))
    return cells


def _markdown_table(header: tuple[str, ...], rows: list[list[str]]) -> str:
    align = ["---" if name in MARKDOWN_LEFT_ALIGNED else "---:" for name in header]
    lines = [header, align, *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def _text(value) -> str:
    """A table cell for a value that may be missing (a teacher's method is null)."""
    return "—" if pd.isna(value) else str(value)


def _format_mean_std(mean: float, std: float, digits: int, scale: float = 1.0, unit: str = "") -> str:
    if pd.isna(mean):
        return "—"
    text = f"{mean * scale:.{digits}f}"
    if not pd.isna(std):
        text += f" ± {std * scale:.{digits}f}"
    return text + unit


def _format_duration(seconds: float, std: float) -> str:
    """Seconds below 100 s, minutes below 100 min, hours beyond; the std in the mean's unit."""
    if pd.isna(seconds):
        return "—"
    scale, unit = (1, " s") if seconds < 100 else (1 / 60, " min") if seconds < 6000 else (1 / 3600, " h")
    return _format_mean_std(seconds, std, 1, scale=scale, unit=unit)


def _format_params(params: float) -> str:
    if pd.isna(params):
        return "—"
    for scale, suffix in ((1e9, "B"), (1e6, "M")):
        if params >= scale:
            return f"{params / scale:.1f}{suffix}"
    return f"{params / 1e3:.0f}K"


# ---- plots ---------------------------------------------------------------------------------------------------


def _pyplot():
    """pyplot on the Agg backend: report jobs run on headless nodes, where an interactive backend would fail."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _model_label(row) -> str:
    """Two-line label: the model, then what it is (teachers: how many classes they cover)."""
    if row.kind == "teacher":
        return f"{row.model}\nteacher · {row.classes} classes"
    if row.kind == "ensemble":
        return f"{row.model}\nensemble · {_text(row.members)} members"
    seeds = f"{row.seeds} seeds" if row.seeds > 1 else "1 seed"
    return f"{row.model}\n{_text(row.method)} · {seeds}"


def _save(fig, path: Path) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")


def _plot_reliability(summary: pd.DataFrame, path: Path) -> None:
    """A grid of reliability diagrams, one per model, each above a histogram of how many examples fall per bin."""
    plt = _pyplot()
    n_models = len(summary)
    ncols = min(n_models, 4)
    nrows = -(-n_models // ncols)
    fig = plt.figure(figsize=(max(3.4 * ncols, 5.0), 4.4 * nrows + 0.6), layout="constrained")
    cells = fig.add_gridspec(nrows, ncols)
    for i, row in enumerate(summary.itertuples(index=False)):
        inner = cells[i // ncols, i % ncols].subgridspec(2, 1, height_ratios=(3.2, 1), hspace=0.05)
        ax, ax_hist = fig.add_subplot(inner[0]), fig.add_subplot(inner[1])
        _draw_reliability(ax, ax_hist, row, first_column=i % ncols == 0)
    # One legend below the grid: inside a panel it would hide the bars of some model or other.
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncol=3, frameon=False, fontsize=9)
    split = summary["split"].iloc[0]
    fig.suptitle(f"Reliability on the {split} split\n(bins pooled over seeds)", fontsize=12)
    _save(fig, path)
    plt.close(fig)


def _draw_reliability(ax, ax_hist, row, first_column: bool) -> None:
    bins = row.reliability
    edges, count = bins["bin_edges"], bins["count"]
    left, width = edges[:-1], np.diff(edges)
    filled = count > 0
    accuracy, confidence = bins["accuracy"][filled], bins["confidence"][filled]

    ax.bar(left[filled], accuracy, width[filled], align="edge", color=ACCURACY_BAR_COLOUR, edgecolor="white",
           linewidth=0.6, label="accuracy")  # fmt: skip
    # Hatched, not filled: an under-confident bin's gap lies over its accuracy bar and must stay readable there.
    ax.bar(left[filled], confidence - accuracy, width[filled], bottom=accuracy, align="edge", facecolor="none",
           edgecolor=GAP_COLOUR, hatch="////", linewidth=0.8, label="gap to mean confidence")  # fmt: skip
    ax.plot([0, 1], [0, 1], linestyle="--", color="0.3", linewidth=1, label="perfect calibration")
    ece = _format_mean_std(row.ece, row.ece_std, 3)
    ax.set_title(f"{_model_label(row)}\nECE = {ece}", fontsize=10)
    ax.set(xlim=(0, 1), ylim=(0, 1))
    ax.tick_params(labelbottom=False, labelsize=8)
    ax.grid(alpha=0.3, linewidth=0.5)

    ax_hist.bar(left, 100 * count / count.sum(), width, align="edge", color="0.55", edgecolor="white",
                linewidth=0.6)  # fmt: skip
    ax_hist.set(xlim=(0, 1))
    ax_hist.set_xlabel("confidence (max probability)", fontsize=9)
    ax_hist.tick_params(labelsize=8)
    ax_hist.grid(axis="y", alpha=0.3, linewidth=0.5)
    if first_column:
        ax.set_ylabel("accuracy", fontsize=9)
        ax_hist.set_ylabel("% examples", fontsize=9)


def _plot_metrics(summary: pd.DataFrame, path: Path) -> None:
    """Horizontal grouped bars per model: accuracy and macro-F1, ECE, NLL; error bars are the seed std."""
    plt = _pyplot()
    from matplotlib.patches import Patch

    n_models = len(summary)
    fig, axes = plt.subplots(
        1, 3, figsize=(14, 1.6 + 0.75 * n_models), sharey=True, layout="constrained",
        gridspec_kw={"width_ratios": (1.6, 1, 1)},
    )  # fmt: skip
    y = np.arange(n_models)
    teacher = (summary["kind"] == "teacher").to_numpy()
    panels = (
        (axes[0], (("accuracy", -0.2), ("macro_f1", 0.2)), 100, "{:.1f}", "accuracy and macro-F1 (%) ↑"),
        (axes[1], (("ece", 0.0),), 1, "{:.3f}", "ECE ↓"),
        (axes[2], (("nll", 0.0),), 1, "{:.3f}", "NLL (nats) ↓"),
    )
    for ax, metrics, scale, fmt, title in panels:
        height = 0.8 / len(metrics)
        for metric, offset in metrics:
            values = scale * summary[metric].to_numpy()
            errors = scale * summary[f"{metric}_std"].to_numpy()
            _hbars(ax, y + offset, values, errors, height * 0.92, METRIC_COLOURS[metric], teacher, fmt)
        ax.set_title(title, fontsize=11)
        ax.set_xlim(0, _upper_limit(summary, metrics, scale))
        ax.grid(axis="x", alpha=0.3, linewidth=0.5)
        ax.tick_params(labelsize=9)
    axes[0].set_yticks(y, [_model_label(row) for row in summary.itertuples(index=False)], fontsize=9)
    axes[0].invert_yaxis()

    handles = [Patch(color=METRIC_COLOURS[m], label=label) for m, label in
               (("accuracy", "accuracy"), ("macro_f1", "macro-F1"), ("ece", "ECE"), ("nll", "NLL"))]  # fmt: skip
    handles.append(Patch(facecolor="white", edgecolor="0.3", hatch=TEACHER_HATCH, label="teacher (own classes)"))
    fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False, fontsize=9)
    split = summary["split"].iloc[0]
    fig.suptitle(f"Models on the {split} split (error bars: std over seeds)", fontsize=13)
    _save(fig, path)
    plt.close(fig)


def _hbars(ax, y, values, errors, height, colour, teacher, fmt) -> None:
    """Bars with teachers hatched, error bars where a std exists, and the value written after each bar."""
    bars = ax.barh(y, values, height, color=colour, edgecolor="white", linewidth=0.6)
    for bar, is_teacher in zip(bars, teacher):
        if is_teacher:
            bar.set_hatch(TEACHER_HATCH)
    has_std = ~np.isnan(errors)
    ax.errorbar(values[has_std], y[has_std], xerr=errors[has_std], fmt="none", ecolor="0.15", capsize=3,
                linewidth=1)  # fmt: skip
    for yi, value, error in zip(y, values, np.nan_to_num(errors)):
        ax.annotate(fmt.format(value), (value + error, yi), xytext=(3, 0), textcoords="offset points",
                    va="center", fontsize=8)  # fmt: skip


def _upper_limit(summary: pd.DataFrame, metrics, scale: float) -> float:
    """Room to the right of the longest bar (plus its error) for the value written after it."""
    ends = [scale * (summary[m] + summary[f"{m}_std"].fillna(0)).max() for m, _ in metrics]
    return max(ends) * 1.18 or 1.0


def _plot_uncertainty(summary: pd.DataFrame, path: Path) -> None:
    """Three panels (total, aleatoric, epistemic): each model's histogram of per-example uncertainty as a density
    step line, seeds pooled, ensembles thick and black; legends give the table's TV distance to the reference."""
    plt = _pyplot()
    shown = summary[summary["uncertainty"].notna()]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.0 + 0.2 * len(shown)), layout="constrained")
    styles = _uncertainty_styles(shown["kind"])
    for ax, part in zip(axes, UNCERTAINTY_PARTS):
        for row, style in zip(shown.itertuples(index=False), styles):
            edges, counts = row.uncertainty["bin_edges"], row.uncertainty["hist"][part]
            ax.stairs(counts / (counts.sum() * np.diff(edges)), edges, label=_tv_label(row, part), **style)
        ax.set_xlim(0, _occupied_limit(shown, part))
        ax.set_title(UNCERTAINTY_TITLES[part], fontsize=11)
        ax.set_xlabel("nats", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3, linewidth=0.5)
        # Below the panel: the labels differ per panel (their TV), and inside it they would hide the lines.
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False, fontsize=8)
    axes[0].set_ylabel("density", fontsize=9)
    split = shown["split"].iloc[0]
    fig.suptitle(
        f"Uncertainty on the {split} split (seeds pooled; TV: total variation distance to the reference ensemble's "
        "histogram, mean ± std over seeds)", fontsize=12,
    )  # fmt: skip
    _save(fig, path)
    plt.close(fig)


def _uncertainty_styles(kinds: pd.Series) -> list[dict]:
    """Line styles in row order: ensembles thick and black (solid, then dashed... if several), others coloured."""
    styles, ensembles, others = [], 0, 0
    for kind in kinds:
        if kind == "ensemble":
            linestyle = ENSEMBLE_LINESTYLES[ensembles % len(ENSEMBLE_LINESTYLES)]
            styles.append({"color": "black", "linewidth": 2.6, "linestyle": linestyle, "zorder": 3})
            ensembles += 1
        else:
            styles.append({"color": f"C{others % 10}", "linewidth": 1.5})
            others += 1
    return styles


def _tv_label(row, part: str) -> str:
    """The model's name with its TV distance to the reference ensemble (mean ± std over seeds) where it has one."""
    tv = getattr(row, f"tv_{part}")
    return row.model if pd.isna(tv) else f"{row.model} (TV {_format_mean_std(tv, getattr(row, f'tv_{part}_std'), 2)})"


def _occupied_limit(summary: pd.DataFrame, part: str) -> float | None:
    """The right edge of the last bin any model fills (None: automatic), so that epistemic values, which crowd
    into the first of the bins up to log C, are not squeezed against the axis."""
    ends = [u["bin_edges"][1:][u["hist"][part] > 0].max(initial=0.0) for u in summary["uncertainty"]]
    return max(ends) or None
