"""The ``report`` stage: summary tables and plots of every evaluation (rendered by ``snakemake --report``)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.report import build_report
from kdpipe.routing.diagnostics import WARN_BELOW


def run(
    params: dict,
    evals: list[Path],
    out: Path,
    routes: list[Path] | None = None,
    models: list[Path] | None = None,
    title: str | None = None,
) -> None:
    """Summarise the evaluation JSONs ``evals`` (the manifests of the experiment's ``routes``, and the training logs
    of the trained ``models``' folders: an imported checkpoint has none) into the report folder ``out``, under
    ``title``. ``params`` is the report's config slice (:meth:`kdpipe.plan.routes.Routes.report_params`): the
    routing warning's threshold ``warn_below``, 0.8 when not given, and ``transfer_curve``: draw ``transfer.png``."""
    logs = [Path(m) / "train_log.jsonl" for m in models or ()]
    logs = [log for log in logs if log.is_file()]
    warn_below = float(params.get("warn_below", WARN_BELOW))
    build_report(
        evals,
        out,
        routes,
        logs,
        title or "Model comparison",
        warn_below=warn_below,
        transfer_curve=bool(params.get("transfer_curve")),
    )
