"""The report stage: compare every evaluated model in tables (summary.tsv, summary.md) and plots (reliability.png,
metrics.png, uncertainty.png), from the per-model evaluation JSONs written by the evaluate stage.

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
from kdpipe.report.markdown import summary_markdown
from kdpipe.report.plots import plot_metrics, plot_reliability, plot_uncertainty
from kdpipe.report.routing import write_routing
from kdpipe.report.summary import TSV_COLUMNS, read_eval, runs_table, summarise

__all__ = ["TSV_COLUMNS", "build_report"]


def build_report(eval_paths: list[str | Path], out_dir: str | Path, routes: list[str | Path] | None = None) -> None:
    """Write summary.tsv, summary.md, reliability.png and metrics.png for ``eval_paths`` into ``out_dir``, and
    uncertainty.png when a model on the plotted split has uncertainty fields (otherwise a stale one is removed; the
    workflow's report rule always has them). The Markdown table shows the uncertainty columns only when some model
    averages several members or heads. With the manifests of the experiment's ``routes``: routing.tsv, routing.md
    and routing.png, and any routing warning at the top of summary.md."""
    if not eval_paths:
        raise KdpipeError("report: no evaluation files given")
    runs = runs_table([read_eval(path) for path in eval_paths])
    summary = summarise(runs)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    warnings = (
        [f"{r['route']}: {r['warning']}" for r in write_routing(routes, out_dir) if r.get("warning")] if routes else []
    )
    with atomic_path(out_dir / "summary.tsv") as tmp:
        summary[list(TSV_COLUMNS)].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    with atomic_path(out_dir / "summary.md") as tmp:
        tmp.write_text(summary_markdown(summary, warnings))
    # Plots show one split (test when there is one): reliability on the validation split says little more.
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    plot_reliability(shown, out_dir / "reliability.png")
    plot_metrics(shown, out_dir / "metrics.png")
    if shown["uncertainty"].notna().any():
        plot_uncertainty(shown, out_dir / "uncertainty.png")
    else:
        # A plot left by an earlier report on other evaluations would contradict the tables.
        (out_dir / "uncertainty.png").unlink(missing_ok=True)
