"""The report stage: compare every evaluated model in tables (summary.tsv, summary.md, summary.html) and plots
(metrics, reliability, confusion matrices, cost against accuracy, training curves, uncertainty), from the per-model
evaluation JSONs and predictions written by the evaluate stage and the training logs.

A row of the summary is one base model on one split; the seeds of a base model (``vkd.seed1``, ``vkd.seed2``...)
are summarised by their mean and sample standard deviation (ddof=1), because seed variation is the yardstick a
difference between methods has to beat. Reliability diagrams pool the seeds' bins (count-weighted), which is the
diagram of all their predictions together; their titles show the mean ECE of the table, so numbers agree.

Evaluations may carry an uncertainty split (docs/methods.md §3): mean total, aleatoric and epistemic uncertainty and
histograms of their per-example values. Each run's histograms are compared with those of its reference ensemble
(kind "ensemble", same split and classes) by total variation distance; the seeds' distances are then averaged like
any metric, and uncertainty.png draws the seeds' pooled histograms. Older evaluations without these fields get blank
cells.

Evaluations may also carry selective-prediction metrics (``metrics.selective``): the summary then has an AURC column
(that of the maximum probability). The out-of-distribution evaluations (``ood.json``, split ``ood``) are no split of
the summary: they make their own table (kdpipe.report.ood) and figures (kdpipe.report.ood_plots), and the landing
page shows them beside the comparison.
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.store import KdpipeError, atomic_path, read_json
from kdpipe.report.cost import plot_cost
from kdpipe.report.curves import plot_curves, read_curve
from kdpipe.report.errors import plot_confusion
from kdpipe.report.html import landing_html, summary_html
from kdpipe.report.markdown import summary_markdown
from kdpipe.report.ood import OOD_SPLIT, check_ood, ood_table, write_ood
from kdpipe.report.ood_plots import plot_ood_roc, plot_risk_coverage
from kdpipe.report.plots import plot_metrics, plot_reliability, plot_uncertainty
from kdpipe.report.routing import write_routing
from kdpipe.report.summary import TSV_COLUMNS, check_eval, has_members, runs_table, summarise, tsv_columns
from kdpipe.report.tensorboard import write_tensorboard
from kdpipe.report.transfer import plot_transfer
from kdpipe.routing.diagnostics import WARN_BELOW

__all__ = ["OOD_OUTPUTS", "TSV_COLUMNS", "build_report"]

# What the report writes from OOD evaluations (the workflow's report rule declares them when ``Plan.has_ood``).
OOD_OUTPUTS = ("ood.tsv", "ood.md", "ood_roc.png", "risk_coverage.png")


def build_report(
    eval_paths: list[str | Path],
    out_dir: str | Path,
    routes: list[str | Path] | None = None,
    train_logs: list[str | Path] | None = None,
    title: str = "Model comparison",
    warn_below: float = WARN_BELOW,
    transfer_curve: bool = False,
) -> None:
    """Write into ``out_dir``: summary.tsv, summary.md and summary.html (the tables), landing.html (the landing
    page's comparison, with metrics.png and cost.png embedded), reliability.png, metrics.png, confusion.png and
    cost.png for ``eval_paths`` (with their predictions beside them), curves.png from the ``train_logs`` (and the
    same logs in TensorBoard's format under tensorboard/ when the optional package is installed), and
    uncertainty.png when a model on the plotted split averages several members or heads (otherwise a stale one is
    removed: the workflow's report rule declares it exactly when the plan has such a model, ``Plan.has_members``), and
    transfer.png when a student learnt from transfer rows or ``transfer_curve`` asks for it (the rule declares it
    when ``Plan.has_transfer_students``; a placeholder says so when every share came to 0 rows).
    The tables show the uncertainty columns only when some model averages several members or heads, and the AURC
    columns only when some evaluation has selective-prediction metrics. The OOD evaluations among ``eval_paths``
    (split ``ood``) make :data:`OOD_OUTPUTS`: ood.tsv and ood.md (the OOD table, also a section of summary.html and,
    compactly, of landing.html), ood_roc.png and risk_coverage.png (among the landing page's key plots); without
    them, stale ones are removed and every other output is as before (the rule declares them when
    ``Plan.has_ood``). With the
    manifests of the experiment's ``routes``: routing.tsv, routing.md and routing.png, and a routing warning at the
    top of the summaries for each route whose chosen router sends fewer than ``warn_below`` of the validation rows
    to the teacher that owns their class (``routing.warn_below``)."""
    if not eval_paths:
        raise KdpipeError("report: no evaluation files given")
    records, oods = _read(eval_paths)
    runs = runs_table(records)
    summary = summarise(runs)
    ood = ood_table(oods) if oods else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    warnings = (
        [f"{r['route']}: {r['warning']}" for r in write_routing(routes, out_dir, warn_below) if r["warning"]]
        if routes
        else []
    )
    with atomic_path(out_dir / "summary.tsv") as tmp:
        summary[list(tsv_columns(summary))].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    # Plots show one split (test when there is one): reliability on the validation split says little more.
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    plot_reliability(shown, out_dir / "reliability.png")
    plot_metrics(shown, out_dir / "metrics.png")
    plot_confusion(shown, out_dir / "confusion.png")
    plot_cost(shown, out_dir / "cost.png")
    key_plots = [out_dir / "metrics.png", out_dir / "cost.png"]  # shown on the landing page, under the table
    if ood is not None:
        write_ood(ood, out_dir)
        plot_ood_roc(ood, out_dir / "ood_roc.png", list(shown["model"]))
        plot_risk_coverage(runs, shown, out_dir / "risk_coverage.png")
        key_plots += [out_dir / "ood_roc.png", out_dir / "risk_coverage.png"]
    else:
        for name in OOD_OUTPUTS:  # left by an earlier report on other evaluations: they would contradict the tables
            (out_dir / name).unlink(missing_ok=True)
    for name, text in (
        ("summary.md", summary_markdown(summary, warnings, title)),
        ("summary.html", summary_html(summary, warnings, title, ood)),
        ("landing.html", landing_html(summary, warnings, title, key_plots, ood)),
    ):
        with atomic_path(out_dir / name) as tmp:
            tmp.write_text(text)
    plot_curves([read_curve(path) for path in train_logs or ()], out_dir / "curves.png")
    if write_tensorboard(list(train_logs or ()), out_dir / "tensorboard"):
        print(f"[kdpipe] report: training logs for TensorBoard: tensorboard --logdir {out_dir / 'tensorboard'}")
    if transfer_curve or (runs["transfer_rows"] > 0).any():
        plot_transfer(runs, shown["split"].iloc[0], out_dir / "transfer.png")
    else:
        (out_dir / "transfer.png").unlink(missing_ok=True)
    if shown["uncertainty"].notna().any() and has_members(shown):
        plot_uncertainty(shown, out_dir / "uncertainty.png")
    else:
        # A plot left by an earlier report on other evaluations would contradict the tables.
        (out_dir / "uncertainty.png").unlink(missing_ok=True)


def _read(paths: list[str | Path]) -> tuple[list[dict], list[dict]]:
    """The checked evaluations of ``paths``: those of the labelled splits, and the OOD ones (split ``ood``)."""
    records, oods = [], []
    for path in paths:
        record = read_json(path)
        if record.get("split") == OOD_SPLIT:
            oods.append(check_ood(record, path))
        else:
            records.append(check_eval(record, path))
    if not records:
        raise KdpipeError(
            f"report: only OOD evaluations given ({', '.join(map(str, paths))}); the report needs a labelled split"
        )
    return records, oods
