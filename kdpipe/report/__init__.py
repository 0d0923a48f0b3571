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
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.store import KdpipeError, atomic_path
from kdpipe.report.cost import plot_cost
from kdpipe.report.curves import plot_curves, read_curve
from kdpipe.report.errors import plot_confusion
from kdpipe.report.html import landing_html, summary_html
from kdpipe.report.markdown import summary_markdown
from kdpipe.report.plots import plot_metrics, plot_reliability, plot_uncertainty
from kdpipe.report.routing import write_routing
from kdpipe.report.summary import TSV_COLUMNS, has_members, read_eval, runs_table, summarise
from kdpipe.report.tensorboard import write_tensorboard
from kdpipe.report.transfer import plot_transfer
from kdpipe.routing.diagnostics import WARN_BELOW

__all__ = ["TSV_COLUMNS", "build_report"]


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
    The tables show the uncertainty columns only when some model averages several members or heads. With the
    manifests of the experiment's ``routes``: routing.tsv, routing.md and routing.png, and a routing warning at the
    top of the summaries for each route whose chosen router sends fewer than ``warn_below`` of the validation rows
    to the teacher that owns their class (``routing.warn_below``)."""
    if not eval_paths:
        raise KdpipeError("report: no evaluation files given")
    runs = runs_table([read_eval(path) for path in eval_paths])
    summary = summarise(runs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    warnings = (
        [f"{r['route']}: {r['warning']}" for r in write_routing(routes, out_dir, warn_below) if r["warning"]]
        if routes
        else []
    )
    with atomic_path(out_dir / "summary.tsv") as tmp:
        summary[list(TSV_COLUMNS)].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    # Plots show one split (test when there is one): reliability on the validation split says little more.
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    plot_reliability(shown, out_dir / "reliability.png")
    plot_metrics(shown, out_dir / "metrics.png")
    plot_confusion(shown, out_dir / "confusion.png")
    plot_cost(shown, out_dir / "cost.png")
    key_plots = [out_dir / "metrics.png", out_dir / "cost.png"]  # shown on the landing page, under the table
    for name, text in (
        ("summary.md", summary_markdown(summary, warnings, title)),
        ("summary.html", summary_html(summary, warnings, title)),
        ("landing.html", landing_html(summary, warnings, title, key_plots)),
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
