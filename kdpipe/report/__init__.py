"""The report stage: compare every evaluated model in tables (summary.tsv, summary.md, summary.html) and plots
(metrics, reliability, confusion matrices, cost against accuracy, training curves, uncertainty), from the per-model
evaluation JSONs and predictions written by the evaluate stage and the training logs.

A row of the summary is one base model on one split, its seeds summarised by their mean and sample standard
deviation; reliability diagrams pool the seeds' bins. What each table and figure shows is in docs/report.md; the OOD
evaluations make their own table (kdpipe.report.ood) and figures (kdpipe.report.ood_plots).
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.store import KdpipeError, atomic_path, read_json
from kdpipe.report.cost import plot_cost
from kdpipe.report.curves import plot_curves, read_curve
from kdpipe.report.errors import plot_confusion
from kdpipe.report.exported import EXPORTED_OUTPUTS, exported_rows, flagged_lines, write_exported
from kdpipe.report.html import landing_html, summary_html
from kdpipe.report.markdown import summary_markdown
from kdpipe.report.ood import OOD_SPLIT, check_ood, ood_table, write_ood
from kdpipe.report.ood_plots import plot_ood_roc, plot_risk_coverage
from kdpipe.report.plots import plot_metrics, plot_reliability, plot_uncertainty
from kdpipe.report.routing import write_routing
from kdpipe.report.serving import SERVING_OUTPUTS, read_profiles, serving_table, with_serving_latency, write_serving
from kdpipe.report.settings import ReportSettings
from kdpipe.report.summary import TSV_COLUMNS, check_eval, has_members, runs_table, summarise, tsv_columns
from kdpipe.report.tensorboard import write_tensorboard
from kdpipe.report.transfer import plot_transfer

__all__ = ["OOD_OUTPUTS", "TSV_COLUMNS", "build_report", "write_report"]

# What the report writes from OOD evaluations (the workflow's report rule declares them when ``Plan.has_ood``).
OOD_OUTPUTS = ("ood.tsv", "ood.md", "ood_roc.png", "risk_coverage.png")
DEFAULTS = ReportSettings()  # the schema's defaults


def write_report(
    settings: ReportSettings,
    evals: list[Path],
    out: Path,
    routes: list[Path] = (),
    models: list[Path] = (),
    serving: list[Path] = (),
    title: str | None = None,
) -> None:
    """The report stage: :func:`build_report` of the evaluation JSONs ``evals``, the ``routes``' manifests, the
    training logs of the ``models``' folders (an imported checkpoint has none) and the ``serving`` profiles into
    ``out``; ``settings``: :meth:`kdpipe.plan.routes.Routes.report_params`."""
    logs = [log for log in (Path(m) / "train_log.jsonl" for m in models) if log.is_file()]
    build_report(evals, out, routes, logs, title or "Model comparison", list(serving) or None, settings)


def build_report(
    eval_paths: list[str | Path],
    out_dir: str | Path,
    routes: list[str | Path] | None = None,
    train_logs: list[str | Path] | None = None,
    title: str = "Model comparison",
    serving: list[str | Path] | None = None,
    settings: ReportSettings = DEFAULTS,
) -> None:
    """Write into ``out_dir`` the tables and figures of docs/report.md for ``eval_paths`` (with their predictions
    beside them) and the ``train_logs``. The optional outputs (uncertainty.png, transfer.png, :data:`OOD_OUTPUTS`,
    the routing, serving and exported files) are written only when there is something to show, which is when the
    report rule declares them; otherwise a stale one is removed. A route that sends fewer than ``settings.warn_below``
    of the validation rows to their class's teacher, and an int8 export whose accuracy falls by more than
    ``settings.max_accuracy_drop``, get a warning at the top of the summaries."""
    if not eval_paths:
        raise KdpipeError("report: no evaluation files given")
    records, oods = _read(eval_paths)
    runs = runs_table(records)
    summary = summarise(runs)
    ood = ood_table(oods) if oods else None
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # Optional outputs left by an earlier report on other evaluations would contradict the tables: those this report
    # has something for are written again below.
    for name in (*EXPORTED_OUTPUTS, *SERVING_OUTPUTS, *OOD_OUTPUTS, "transfer.png", "uncertainty.png"):
        (out_dir / name).unlink(missing_ok=True)
    routed = write_routing(routes, out_dir, settings.warn_below) if routes else []
    warnings = [f"{r['route']}: {r['warning']}" for r in routed if r["warning"]]
    exported = exported_rows(records, settings.max_accuracy_drop)
    if len(exported):
        write_exported(exported, out_dir)
        warnings += flagged_lines(exported, settings.max_accuracy_drop)
    with atomic_path(out_dir / "summary.tsv") as tmp:
        summary[list(tsv_columns(summary))].to_csv(tmp, sep="\t", index=False, na_rep="", float_format="%.6g")
    # Plots show one split (test when there is one): reliability on the validation split says little more.
    shown = summary[summary["split"] == summary["split"].iloc[0]]
    plot_reliability(shown, out_dir / "reliability.png")
    plot_metrics(shown, out_dir / "metrics.png")
    plot_confusion(shown, out_dir / "confusion.png")
    profiles = read_profiles(serving) if serving else []
    plot_cost(with_serving_latency(shown, profiles) if profiles else shown, out_dir / "cost.png")
    if profiles:
        write_serving(serving_table(profiles, shown), out_dir)
    key_plots = [out_dir / "metrics.png", out_dir / "cost.png"]  # shown on the landing page, under the table
    if ood is not None:
        write_ood(ood, out_dir)
        plot_ood_roc(ood, out_dir / "ood_roc.png", list(shown["model"]))
        plot_risk_coverage(runs, shown, out_dir / "risk_coverage.png")
        key_plots += [out_dir / "ood_roc.png", out_dir / "risk_coverage.png"]
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
    if settings.transfer_curve or (runs["transfer_rows"] > 0).any():
        plot_transfer(runs, shown["split"].iloc[0], out_dir / "transfer.png")
    if shown["uncertainty"].notna().any() and has_members(shown):
        plot_uncertainty(shown, out_dir / "uncertainty.png")


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
