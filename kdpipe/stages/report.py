"""The ``report`` stage: summary tables and plots of every evaluation (rendered by ``snakemake --report``)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.report import build_report


def run(params: dict, evals: list[Path], out: Path, routes: list[Path] | None = None) -> None:
    """Summarise the evaluation JSONs ``evals`` (and the manifests of the experiment's ``routes``) into the report
    folder ``out``."""
    build_report(evals, out, routes)
