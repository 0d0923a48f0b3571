"""Progress of long passes and the one-line summary of every job (docs/design.md, "Compute").

Every pass over rows shows a bar in rows on stderr (a log file gets a line at most every ``FILE_INTERVAL`` seconds)
and adds its rows to the process's count (:func:`rows_done`), which :func:`summary_line` reports.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path
from typing import TextIO

from tqdm.std import tqdm

TERMINAL_INTERVAL = 1.0  # seconds between redraws on a terminal
FILE_INTERVAL = 10.0  # seconds between lines written into a log file

_rows = [0]
_console: list[TextIO] = []  # where the lines for the user go besides the log, once the output is in a log


def log_to(path: Path) -> None:
    """Send everything this process (and what it starts) writes into the log file ``path``; :func:`say` still
    reaches the console too."""
    sys.stdout.flush()
    sys.stderr.flush()
    _console[:] = [os.fdopen(os.dup(2), "w", buffering=1)]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def say(text: str) -> None:
    """A line for the user: on stderr (the job's log) and on the console when the log is not the console."""
    print(text, file=sys.stderr, flush=True)
    for console in _console:
        print(text, file=console, flush=True)


def rows_done() -> int:
    """The rows every progress bar of this process has gone through so far."""
    return _rows[0]


class _Lines:
    """A log file as tqdm's output: each redraw as one line of its own."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


class RowBar(tqdm):
    """A tqdm bar in rows that counts them into :func:`rows_done`, even when it is not shown."""

    def update(self, n: int = 1):
        _rows[0] += int(n)
        return super().update(n)


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def bar(total: int, desc: str | None = None, *, initial: int = 0, disable: bool = False, file=None) -> RowBar:
    """A progress bar over ``total`` rows on ``file`` (stderr), ``initial`` done already; hidden without ``desc``."""
    stream = sys.stderr if file is None else file
    terminal = _is_terminal(stream)
    interval = TERMINAL_INTERVAL if terminal else FILE_INTERVAL
    return RowBar(
        total=total,
        initial=initial,
        desc=desc,
        unit=" rows",
        file=stream if terminal else _Lines(stream),
        mininterval=interval,
        maxinterval=max(interval, 10.0),
        dynamic_ncols=terminal,
        ncols=None if terminal else 100,
        disable=disable or desc is None,
    )


def peak_memory_mb() -> float:
    """This process's peak resident memory so far, in MB."""
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kilobytes on Linux, bytes on macOS
    return kb / 2**20 if sys.platform == "darwin" else kb / 1024


def summary_line(what: str, rows: int, seconds: float, peak_mb: float) -> str:
    """``[kdpipe] logits minilm_a/train: 1,000,000 rows in 412.0 s (2,427 rows/s), peak 812 MB`` (or ``done in``)."""
    if rows:
        rate = rows / seconds if seconds > 0 else float("inf")
        return f"[kdpipe] {what}: {rows:,} rows in {seconds:.1f} s ({rate:,.0f} rows/s), peak {peak_mb:,.0f} MB"
    return f"[kdpipe] {what}: done in {seconds:.1f} s, peak {peak_mb:,.0f} MB"
