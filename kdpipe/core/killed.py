"""The last line of a job killed by a signal (docs/design.md, "Compute"): its log says so, instead of ending mid-way.

For the signals a process can catch (:data:`CAUGHT`) the job says so, then ends by the same signal; Ctrl-C first
unwinds as a KeyboardInterrupt, so cleanup runs, and ends without a traceback (:func:`end_if_interrupted`). SIGKILL
leaves no line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_said: set[int] = set()  # the signals that this process said it was killed by and unwinds (SIGINT)


def say_when_killed(what: str) -> None:
    """From now on a signal of :data:`CAUGHT` (unless ignored) first writes ``[kdpipe] WHAT: killed by SIGTERM (signal
    15); its outputs were not finished`` (SIGINT then raises KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum, frame):
        line = f"killed by {signal.Signals(signum).name} (signal {signum}); its outputs were not finished"
        print(f"[kdpipe] {what}: {line}", file=sys.stderr, flush=True)
        if signum == signal.SIGINT:
            _said.add(signum)
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    for sig in CAUGHT:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)


def end_if_interrupted() -> None:
    """After a KeyboardInterrupt reached the command: when it came from a Ctrl-C that :func:`say_when_killed` said,
    end this process by SIGINT without a traceback; otherwise return, and the caller raises it on."""
    if signal.SIGINT not in _said:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
