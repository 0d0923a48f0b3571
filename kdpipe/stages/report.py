"""The ``report`` stage: summary tables and plots of every evaluation (rendered by ``snakemake --report``)."""

from __future__ import annotations

from pathlib import Path

from kdpipe.report import build_report


def run(params: dict, evals: list[Path], out: Path) -> None:
    """Summarise the evaluation JSONs ``evals`` into the report folder ``out``."""
    build_report(evals, out)
