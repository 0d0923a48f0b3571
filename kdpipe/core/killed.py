"""The last line of a job killed by a signal (docs/design.md, "Compute"): its log says so, instead of ending mid-way.

A job's own process says it for the signals it can catch (:data:`CAUGHT`: Snakemake's and SLURM's SIGTERM, a closed
terminal's SIGHUP, Ctrl-C), then ends by the same signal, so that the shell and Snakemake see what happened. A job
killed by a signal no process can catch (SIGKILL: the kernel's out-of-memory killer, a cluster's time limit) leaves
no line: only Snakemake's own log says the job failed, with exit status 137.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def killed_line(what: str, signum: int) -> str:
    """``[kdpipe] distill s_vkd: killed by SIGTERM (signal 15); its outputs were not finished``."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = "a signal"
    hint = " (out of memory? the kernel's OOM killer sends it)" if signum == signal.SIGKILL else ""
    return f"[kdpipe] {what}: killed by {name} (signal {signum}){hint}; its outputs were not finished"


def say_when_killed(what: str) -> None:
    """From now on, a signal of :data:`CAUGHT` that this process does not ignore writes :func:`killed_line` to
    stderr (the job's log) first; SIGINT then raises KeyboardInterrupt as before, the others end the process."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        print(killed_line(what, signum), file=sys.stderr, flush=True)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in CAUGHT:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)
