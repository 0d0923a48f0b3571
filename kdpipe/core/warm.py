"""Warm start: jobs forked from a process that has already imported torch and transformers
(docs/design.md, "Warm start").

Importing torch, transformers and kdpipe's stages takes about 4 s of CPU, which is most of a small job. While a
workflow runs its jobs on the local machine, it starts one server (:func:`start`, from Snakemake's ``onstart``)
that imports them once and then waits on a Unix socket in a private folder. A job's ``python -m kdpipe ...``
(:func:`run_warm`) hands the server its arguments, working directory, environment and standard streams; the server
forks a copy of itself that becomes the job, and reports the copy's exit status back. The job's own process waits
for it, passes on SIGINT, SIGTERM and SIGHUP, and exits as it did; if that process dies, even by SIGKILL, the copy
kills itself at once, so stopping a job works as before.

A job starts afresh, as without the server, whenever the copy could differ from a fresh process: another Python,
``sys.path`` or library version, a kdpipe source file changed since the server started (its size, times or inode),
an environment that differs in anything but what Snakemake sets per job (threads, temporary folder) or
``CUDA_VISIBLE_DEVICES``, a multi-process training job, or no server listening. The server never initialises CUDA
and is not started where an NVIDIA device is present (a fork after CUDA starts cannot use it); it exits when the
workflow ends, when the Snakemake process that started it is gone, or after an idle hour.

Written by hand: Python's ``multiprocessing`` forkserver serves only the process that started it, and a job here is
a separate process started by Snakemake's shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kdpipe.core.killed import CAUGHT, killed_line

SOCKET_ENV = "KDPIPE_WARM_SOCKET"  # the server's socket, set for the jobs by the workflow
SWITCH_ENV = "KDPIPE_WARM"  # "0" turns warm start off
# Set by Snakemake for each job (threads, tmpdir, the rules' shell prefix putting the venv first on PATH) or by the
# GPU pool: read when a job runs, not when it imports; a copy takes the job's values.
PER_JOB = {
    "PATH",
    "OMP_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "TMPDIR",
    "TMP",
    "TEMP",
    "TEMPDIR",
    "CUDA_VISIBLE_DEVICES",
    "_",
    "SHLVL",
    "PWD",
    "OLDPWD",
    SOCKET_ENV,
}
# Passed on from a job's process to its copy (SIGSTOP cannot be caught: stopping the job's process does not stop
# its copy; Ctrl-Z, SIGTSTP, stops both)
PASSED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGCONT, signal.SIGUSR1, signal.SIGUSR2)
IDLE_S = 3600
POLL_S = 0.05
HANDSHAKE_S = 30
PACKAGE = Path(__file__).resolve().parents[1]


def available() -> bool:
    """Whether this machine may run the server: not switched off, a POSIX system, and no NVIDIA device."""
    return os.environ.get(SWITCH_ENV, "1") != "0" and hasattr(os, "fork") and not Path("/dev/nvidiactl").exists()


def identity() -> dict:
    """What the server and a job must share for a forked copy to be the job a fresh process would be."""
    from kdpipe.core.identity import software_versions

    sources = sorted(
        [str(path.relative_to(PACKAGE)), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
        for path in PACKAGE.rglob("*.py")
        for stat in [path.stat()]
    )
    return {
        "python": [os.path.realpath(sys.executable), sys.prefix, sys.version],  # python or python3 of one venv
        "path": sys.path,
        "package": str(PACKAGE),
        "versions": software_versions(),
        # any install or removal in the environment changes its folders' times: the server's libraries may be old
        "libraries": [[entry, os.stat(entry).st_mtime_ns] for entry in sys.path if _library_folder(entry)],
        "sources": sources,
    }


def _library_folder(entry: str) -> bool:
    """A folder of installed libraries on ``sys.path`` (not the project's, where the jobs write)."""
    return os.path.isdir(entry) and Path(entry).resolve() not in (PACKAGE.parent, Path.cwd().resolve())


def _environment(env: dict) -> dict:
    return {key: value for key, value in env.items() if key not in PER_JOB}


# ---- the job's side


def run_warm(argv: list[str]) -> int | None:
    """Run ``python -m kdpipe argv`` as a copy of the warm server; None when the job must start afresh."""
    path = os.environ.get(SOCKET_ENV)
    if not path or not available() or _processes(argv) > 1:
        return None
    # signals this process ignores (nohup, a background job of a script) its copy ignores too, and they pass on none
    passed = [sig for sig in PASSED if signal.getsignal(sig) != signal.SIG_IGN]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HANDSHAKE_S)  # a server too busy to answer: start afresh (a late copy sees this end closed)
    try:
        sock.connect(path)
        request = {
            "argv": argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "ignored": [int(sig) for sig in PASSED if sig not in passed],
            "identity": identity(),
        }
        socket.send_fds(sock, [b"\0"], [0, 1, 2])  # the standard streams, then the request
        sock.sendall(json.dumps(request).encode() + b"\n")
        reader = sock.makefile("r")
        reply = json.loads(reader.readline() or "{}")
    except (OSError, ValueError):
        sock.close()
        return None
    if "pid" not in reply:
        if reply.get("refused"):
            print(f"[kdpipe] warm start: {reply['refused']}; starting afresh", file=sys.stderr)
        sock.close()
        return None
    pid = reply["pid"]
    for sig in passed:
        signal.signal(sig, lambda signum, frame: _pass_on(pid, signum))
    sock.settimeout(None)
    try:
        status = json.loads(reader.readline() or "{}")
    except (OSError, ValueError):
        status = {}
    sock.close()
    if not status:  # the server is gone, and its copy with it (it dies with the server): nothing finished
        print("[kdpipe] warm start: the server stopped while the job ran; the job was stopped", file=sys.stderr)
        return 1
    if "signal" in status:  # killed: end the same way, so that the shell and Snakemake see what happened
        if status["signal"] not in CAUGHT:  # (the copy said it of the others itself: kdpipe.core.killed)
            print(killed_line(f"{_job_name(argv)} (warm copy {pid})", status["signal"]), file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):  # (SIGKILL and SIGSTOP take no handler: they end a process anyway)
            signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    return int(status.get("exit", 1))


def _job_name(argv: list[str]) -> str:
    """The job's name as its copy's own line would say it (kdpipe.cli.job_name); "the job" when its arguments do not
    parse (they did in the copy)."""
    try:
        from kdpipe.cli import _arguments, job_name

        args = _arguments(argv)
        return job_name(args.pop("command"), args.pop("params"), args)
    except (Exception, SystemExit):
        return "the job"


def _pass_on(pid: int, signum: int) -> None:
    """A signal to the job's process, for its copy. Ctrl-Z stops both and a later SIGCONT resumes both."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP if signum == signal.SIGTSTP else signum)
    if signum == signal.SIGTSTP:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until SIGCONT
        signal.signal(signal.SIGTSTP, lambda signum, frame: _pass_on(pid, signum))


def _processes(argv: list[str]) -> int:
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--processes=") else None
        if arg == "--processes" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None:
            return int(value) if value.isdigit() else 1
    return 1


# ---- the server's side


def start() -> dict | None:
    """Start a server for this process's jobs (the caller: Snakemake); returns ``{"pid", "socket"}`` or None."""
    if not available():
        return None
    folder = tempfile.mkdtemp(prefix="kdpipe-warm-")  # mode 0700: no other user can reach the socket
    path = os.path.join(folder, "s")
    log = Path(".snakemake") / "kdpipe-warm.log"  # why a server did not start, if it did not
    with open(log if log.parent.is_dir() else os.devnull, "a") as stderr:  # (a server of an earlier run may write)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kdpipe.core.warm", path, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=stderr,
            stderr=stderr,
            start_new_session=True,  # not stopped by a Ctrl-C meant for the jobs: it stops when told or orphaned
        )
    os.environ[SOCKET_ENV] = path
    return {"pid": proc.pid, "socket": path}


def stop(server: dict | None) -> None:
    """Stop a server :func:`start` returned (its jobs have ended) and remove its socket and folder."""
    os.environ.pop(SOCKET_ENV, None)
    if not server:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(server["pid"], signal.SIGTERM)
    with contextlib.suppress(OSError):  # (the server removes them too, unless it was killed)
        os.unlink(server["socket"])
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(server["socket"]))


def serve(path: str, owner: int) -> None:
    """Import everything a job needs, then fork one copy per request until stopped, orphaned or idle."""
    import importlib

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))  # before the seconds of imports
    mine = json.loads(json.dumps(identity()))  # before importing: a file edited meanwhile is refused, not served
    before = dict(os.environ)
    env = _environment(before)
    from kdpipe.stages import STAGES

    for stage in STAGES.values():
        importlib.import_module(stage.module)
    import kdpipe.cli  # noqa: F401

    # what the imports set (torch sets KMP_* variables), as they would in a fresh process
    imported = {key: value for key, value in os.environ.items() if before.get(key) != value}
    if stopping:  # told to stop while importing: the workflow ended before the server was needed
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(path))
        return
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(POLL_S)
    jobs: dict[int, socket.socket] = {}
    last = time.monotonic()
    # Serve until told to stop, orphaned or idle; then accept no more jobs, but report on those still running
    while not stopping and _alive(owner) and (jobs or time.monotonic() - last < IDLE_S):
        _reap(jobs)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        last = time.monotonic()
        conn.settimeout(HANDSHAKE_S / 6)  # a job that connects and says nothing holds up no other
        pid = _fork_job(conn, [listener, *jobs.values()], mine, env, imported)
        if pid is None:
            conn.close()
        else:
            jobs[pid] = conn
    listener.close()
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(os.path.dirname(path))
    while jobs:
        _reap(jobs)
        time.sleep(POLL_S)


def _alive(owner: int) -> bool:
    """Whether the Snakemake process that started the server still runs (it is the server's parent)."""
    return os.getppid() == owner


def _reap(jobs: dict[int, socket.socket]) -> None:
    """Report each ended copy's exit status to its job."""
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = jobs.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):
            reply = {"signal": os.WTERMSIG(status)}
        else:
            reply = {"exit": os.waitstatus_to_exitcode(status)}
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.close()


def _fork_job(conn: socket.socket, others: list[socket.socket], mine: dict, env: dict, imported: dict) -> int | None:
    """Read one request; fork the copy that runs it and return its pid, or answer why not and return None."""
    fds: list[int] = []
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        with conn.makefile("rb") as reader:
            request = json.loads(reader.readline())
    except (OSError, ValueError):
        for fd in fds:
            os.close(fd)
        return None
    refused = _refusal(request, mine, env, fds)
    if refused:
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):
            conn.sendall(json.dumps({"refused": refused}).encode() + b"\n")
        return None
    conn.settimeout(None)
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        from kdpipe.stages import STAGES

        stage = next((arg for arg in request["argv"] if arg in STAGES), "?")
        print(f"[kdpipe] warm start: {stage} as process {pid}", file=sys.stderr, flush=True)
        try:
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:
            os.kill(pid, signal.SIGKILL)
        return pid
    for other in others:  # the listener and the other jobs' connections are the server's
        other.close()
    _become_job(conn, fds, request, imported)  # never returns: the copy exits with the job's status


def _refusal(request: dict, mine: dict, env: dict, fds: list[int]) -> str | None:
    if len(fds) != 3:
        return "the job's standard streams did not arrive"
    if request.get("identity") != mine:
        theirs = request.get("identity") or {}
        what = next((key for key in mine if mine[key] != theirs.get(key)), "identity")
        return {"sources": "kdpipe's code changed since the server started"}.get(what, f"another {what}")
    theirs = _environment(request.get("env") or {})
    if theirs != env:
        names = sorted(key for key in set(theirs) | set(env) if theirs.get(key) != env.get(key))
        return f"another environment ({', '.join(names[:5])})"
    return None


def _become_job(conn: socket.socket, fds: list[int], request: dict, imported: dict) -> None:
    """In the forked copy: take the job's streams, folder, environment, ignored signals and arguments, run it and
    exit with its status. The end is as ``multiprocessing`` ends a forked child: exit handlers and a flush, then
    ``os._exit``; tearing down every imported module would touch, and so copy, all the server's memory (1.4 s)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    for sig in request.get("ignored") or []:
        signal.signal(sig, signal.SIG_IGN)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    sys.stdout.reconfigure(line_buffering=os.isatty(1))
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(imported)
    tempfile.tempdir = None  # the job's TMPDIR
    _blas_threads()
    sys.argv = [sys.argv[0], *request["argv"]]
    # the job's process gone (killed, even by SIGKILL): so is its copy
    import threading

    threading.Thread(target=_die_with_job, args=(conn, os.getppid()), daemon=True).start()
    from kdpipe.cli import main

    try:
        status = _exit_status(main())  # (the process's own command: sys.argv, as a fresh process runs it)
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _blas_threads() -> None:
    """numpy's BLAS reads its thread count once, when the server imported it: give the copy the count a fresh process
    would have read from the job's environment (torch's comes from ``--threads``)."""
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):  # OpenBLAS's order
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=int(value), user_api="blas")
            return


def _exit_status(code) -> int:
    """The status ``sys.exit(code)`` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _die_with_job(conn: socket.socket, server: int) -> None:
    """SIGKILL this copy as soon as the job's process is gone (its end of the connection closes) or the server is
    (this copy is reparented): a job whose server died fails, and its copy finishes nothing behind its back."""
    conn.settimeout(POLL_S * 10)
    while os.getppid() == server:
        try:
            if not conn.recv(1):
                break
        except TimeoutError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]))
