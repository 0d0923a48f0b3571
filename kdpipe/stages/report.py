"""The ``report`` stage: summary tables and plots of every evaluation (rendered by ``snakemake --report``)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.report import build_report


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
    ``title``."""
    logs = [Path(m) / "train_log.jsonl" for m in models or ()]
    build_report(evals, out, routes, [log for log in logs if log.is_file()], title or "Model comparison")
