"""Warm start: jobs forked from a process that has already imported torch and transformers (docs/design.md,
"Warm start").

While a workflow runs its jobs on a Linux machine without an NVIDIA or ROCm device, it starts one server
(:func:`start`, from Snakemake's ``onstart``) that imports every stage once and waits on a Unix socket in a private
folder. A job's ``python -m kdpipe ...`` (:func:`run_warm`) hands the server its arguments, working directory,
environment and standard streams; the server forks a single-threaded copy of itself that becomes the job. The job's
process passes its signals on to the copy and exits as the copy did; it waits on the copy's own report, and on the
state of the copy and the server (``/proc``), so a stopped or dead server never holds it. A job starts afresh
whenever the copy could differ from a fresh process (another Python, ``sys.path``, library or kdpipe source, or
environment), when the server runs more than one thread (said once, then the server stops), or when no server
answers. Written by hand: Python's ``multiprocessing`` forkserver serves only the process that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from kdpipe.core.killed import CAUGHT, killed_line
from kdpipe.stages import STAGES  # (the table only: a stage's module is imported when it runs)

SOCKET_ENV = "KDPIPE_WARM_SOCKET"  # the server's socket, set for the jobs by the workflow
SWITCH_ENV = "KDPIPE_WARM"  # "0" turns warm start off
# NVIDIA's and ROCm's devices: a process forked after CUDA (or HIP) has started cannot use it
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")  # in OpenBLAS's order
# Set by Snakemake for each job (threads, tmpdir, the rules' shell prefix putting the venv first on PATH) or by the
# GPU pool: read when a job runs, not when it imports; a copy takes the job's values.
PER_JOB = {
    *BLAS_THREADS,
    *("PATH", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS", "CUDA_VISIBLE_DEVICES", SOCKET_ENV),
    *("TMPDIR", "TMP", "TEMP", "TEMPDIR", "_", "SHLVL", "PWD", "OLDPWD"),
}
# What the server imports with, so that no library starts a thread: numpy's OpenBLAS pool, Arrow's jemalloc purger
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}
# Passed on from a job's process to its copy (SIGSTOP cannot be caught; Ctrl-Z, SIGTSTP, stops both)
PASSED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGTSTP, signal.SIGCONT, signal.SIGUSR1, signal.SIGUSR2)
IDLE_S = 3600
POLL_S = 0.05
HANDSHAKE_S = 30  # the longest a job waits for a running server to fork its copy, or to report one that ended mute
PACKAGE = Path(__file__).resolve().parent
ENDED, HALTED = ("Z", "X", ""), ("T", "t", "Z", "X", "")  # process states (/proc): ended or gone; also stopped


def available() -> bool:
    """Whether this machine may run the server: not switched off, Linux, and no NVIDIA or ROCm device."""
    gpu = any(map(os.path.exists, GPU_DEVICES))
    return os.environ.get(SWITCH_ENV, "1") != "0" and sys.platform == "linux" and not gpu


def identity() -> dict:
    """What the server and a job must share for a forked copy to be the job a fresh process would be."""
    from kdpipe.core.identity import software_versions

    sources = sorted(
        [str(path.relative_to(PACKAGE)), stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
        for path in PACKAGE.rglob("*.py")
        for stat in [path.stat()]
    )
    project = (PACKAGE.parent, Path.cwd().resolve())  # not libraries: the jobs write there
    libraries = [entry for entry in sys.path if os.path.isdir(entry) and Path(entry).resolve() not in project]
    return {
        "python": [os.path.realpath(sys.executable), sys.prefix, sys.version],  # python or python3 of one venv
        "path": sys.path,
        "package": str(PACKAGE),
        "versions": software_versions(),
        # any install or removal in the environment changes its folders' times: the server's libraries may be old
        "libraries": [[entry, os.stat(entry).st_mtime_ns] for entry in libraries],
        "sources": sources,
    }


def _environment(env: dict) -> dict:
    return {key: value for key, value in env.items() if key not in PER_JOB}


def _state(pid: int) -> str:
    """Process ``pid``'s state as ``/proc`` shows it (R, S, D: running; T, t: stopped; Z: ended), "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _read_line(sock: socket.socket, server: int, copy: int | None = None, limit: float = HANDSHAKE_S) -> dict:
    """The next JSON line on the connection, or ``{}`` when none will come: the connection closed; or neither the
    copy (when there is one) runs nor the server, which is stopped or gone; or the server, running, has not
    answered for ``limit`` seconds since the copy ended (or since the request, before a copy)."""
    line, quiet, byte = b"", 0.0, b" "
    sock.settimeout(POLL_S * 10)
    while byte and not line.endswith(b"\n"):
        try:
            byte = sock.recv(1)
            line += byte
        except TimeoutError:  # a stopped copy may go on; a stopped (SIGSTOP, a debugger, a frozen cgroup) server not
            copy_runs = copy is not None and _state(copy) not in ENDED
            quiet = 0.0 if copy_runs else quiet + POLL_S * 10
            byte = b"" if not copy_runs and (quiet > limit or _state(server) in HALTED) else byte
        except OSError:
            byte = b""
    with contextlib.suppress(ValueError):
        return json.loads(line) if byte else {}
    return {}


# ---- the job's side


def run_warm(argv: list[str]) -> int | None:
    """Run ``python -m kdpipe argv`` as a copy of the warm server; None when the job must start afresh."""
    path = os.environ.get(SOCKET_ENV)
    if not path or not available() or _processes(argv) > 1:
        return None
    # signals this process ignores (nohup, a background job of a script) its copy ignores too, and they pass on none
    passed = [sig for sig in PASSED if signal.getsignal(sig) != signal.SIG_IGN]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(HANDSHAKE_S)
    try:
        sock.connect(path)
        server = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        ignored = [int(sig) for sig in PASSED if sig not in passed]
        request = dict(argv=argv, cwd=os.getcwd(), env=dict(os.environ), ignored=ignored, identity=identity())
        sock.sendall(json.dumps(request).encode() + b"\n")
        # the standard streams go once the server has read the request (held by a stopped server, a pipe's other
        # end would wait on it), then it forks
        reply = _read_line(sock, server)  # a stopped server: at once; a busy one: after HANDSHAKE_S
        if reply.get("ready"):
            socket.send_fds(sock, [b"\0"], [0, 1, 2])
            reply = _read_line(sock, server)
    except OSError:
        reply = {}
    if "pid" not in reply:
        if reply.get("refused"):
            print(f"[kdpipe] warm start: {reply['refused']}; starting afresh", file=sys.stderr)
        sock.close()
        return None
    copy = reply["pid"]
    for sig in passed:
        signal.signal(sig, lambda signum, frame: _pass_on(copy, signum))
    status = _read_line(sock, server, copy)  # the copy's report, else the server's
    sock.close()
    if not status:  # the copy ended without a word (the server died, and it with it): nothing finished
        state = "gone" if _state(server) in ENDED else "stopped"
        print(f"[kdpipe] warm start: the server stopped while the job ran (process {server}: {state})", file=sys.stderr)
        return 1
    if "signal" in status:  # killed: end the same way, so that the shell and Snakemake see what happened
        if status["signal"] not in CAUGHT:  # (the copy said it of the others itself: kdpipe.core.killed)
            print(killed_line(f"the job's copy {copy}", status["signal"]), file=sys.stderr, flush=True)
        with contextlib.suppress(OSError):  # (SIGKILL and SIGSTOP take no handler: they end a process anyway)
            signal.signal(status["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), status["signal"])
    return int(status.get("exit", 1))


def _pass_on(pid: int, signum: int) -> None:
    """A signal to the job's process, for its copy. Ctrl-Z stops both and a later SIGCONT resumes both."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP if signum == signal.SIGTSTP else signum)
    if signum == signal.SIGTSTP:
        signal.signal(signal.SIGTSTP, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTSTP)  # stops here until SIGCONT
        signal.signal(signal.SIGTSTP, lambda signum, frame: _pass_on(pid, signum))


def _processes(argv: list[str]) -> int:
    """The processes a training job asks for (``--processes N``): more than one are never forked."""
    for arg, following in zip(argv, [*argv[1:], ""]):
        if arg == "--processes" or arg.startswith("--processes="):
            value = arg.partition("=")[2] or following
            return int(value) if value.isdigit() else 1
    return 1


# ---- the server's side


def start() -> dict | None:
    """Start a server for this process's jobs (the caller: Snakemake); returns ``{"pid", "socket"}`` or None."""
    if not available():
        return None
    path = os.path.join(tempfile.mkdtemp(prefix="kdpipe-warm-"), "s")  # mode 0700: no other user reaches the socket
    log = Path(".snakemake") / "kdpipe-warm.log"  # what the server did, and why it stopped serving if it did
    with open(log if log.parent.is_dir() else os.devnull, "a") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kdpipe.warm", path, str(os.getpid())],
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
    if server:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server["pid"], signal.SIGTERM)
        _remove(server["socket"])


def _remove(path: str) -> None:
    for remove, target in ((os.unlink, path), (os.rmdir, os.path.dirname(path))):
        with contextlib.suppress(OSError):
            remove(target)


def serve(path: str, owner: int) -> None:
    """Import everything a job needs, then fork one copy per request until stopped, orphaned, idle or no longer
    single-threaded."""
    stopping: list[str] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append("told to"))  # before the seconds of imports
    mine = json.loads(json.dumps(identity()))  # before importing: a file edited meanwhile is refused, not served
    env = _environment(os.environ)
    os.environ.update(SINGLE_THREADED)
    before = dict(os.environ)
    for stage in STAGES.values():
        importlib.import_module(stage.module)
    import kdpipe.cli  # noqa: F401

    # what the imports set (torch sets KMP_* variables), as they would in a fresh process
    imported = {key: value for key, value in os.environ.items() if before.get(key) != value}
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(POLL_S)
    jobs: dict[int, socket.socket] = {}
    last = time.monotonic()
    # Serve until told to stop, orphaned or idle; then accept no more jobs, but report on those still running
    while not stopping and os.getppid() == owner and (jobs or time.monotonic() - last < IDLE_S):
        _reap(jobs)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        last = time.monotonic()
        conn.settimeout(HANDSHAKE_S / 6)  # a job that connects and says nothing holds up no other
        pid = _fork_job(conn, [listener, *jobs.values()], mine, env, imported, stopping)
        if pid is None:
            conn.close()
        else:
            jobs[pid] = conn
    listener.close()
    _remove(path)
    while jobs:
        _reap(jobs)
        time.sleep(POLL_S)


def _reap(jobs: dict[int, socket.socket]) -> None:
    """Report each ended copy's exit status to its job (which took the copy's own report if it came first)."""
    while jobs:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn, exited = jobs.pop(pid, None), {"exit": os.waitstatus_to_exitcode(status)}
        reply = {"signal": os.WTERMSIG(status)} if os.WIFSIGNALED(status) else exited
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(reply).encode() + b"\n")
            conn.close()


def _fork_job(conn, others: list, mine: dict, env: dict, imported: dict, stopping: list) -> int | None:
    """Read one request; fork the copy that runs it and return its pid, or answer why not and return None."""
    fds: list[int] = []
    try:
        with conn.makefile("rb") as reader:  # (nothing follows the request before the server answers it)
            request = json.loads(reader.readline())
        refused, threads = _refusal(request, mine, env), len(os.listdir("/proc/self/task"))
        if not refused and threads > 1:  # a fork copies only the calling thread: never fork then, and stop serving
            refused = f"the server runs {threads} threads (a fork copies one)"
            print(f"[kdpipe] warm start: {refused}; no more jobs are forked", file=sys.stderr, flush=True)
            stopping.append(refused)
        conn.sendall(json.dumps({"refused": refused} if refused else {"ready": True}).encode() + b"\n")
        if not refused:
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
    except (OSError, ValueError):
        refused = "no request"
    if refused or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    conn.settimeout(None)
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
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


def _refusal(request: dict, mine: dict, env: dict) -> str | None:
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
    """In the forked copy: take the job's streams, folder, environment, ignored signals and arguments, run it, report
    its status to the job and exit with it. The end is as ``multiprocessing`` ends a forked child: exit handlers and a
    flush, then ``os._exit``; tearing down every imported module would touch, and so copy, all the server's memory."""
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
    os.environ.update({**request["env"], **imported})
    tempfile.tempdir = None  # the job's TMPDIR
    _blas_threads()
    sys.argv = [sys.argv[0], *request["argv"]]
    # the job's process gone (killed, even by SIGKILL), or the server: so is its copy
    threading.Thread(target=_die_with_job, args=(conn, os.getppid()), daemon=True).start()
    from kdpipe.cli import main

    try:
        status = _exit_status(main(request["argv"]))
    except SystemExit as stop:
        status = _exit_status(stop.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(OSError):  # the job needs no server to learn how its copy ended
        conn.sendall(json.dumps({"exit": status}).encode() + b"\n")
    os._exit(status)


def _blas_threads() -> None:
    """numpy's BLAS read its thread count when the server imported it (one): give the copy the count a fresh process
    would read from the job's environment, else one per usable core (torch's comes from ``--threads``)."""
    from threadpoolctl import threadpool_limits

    value = next((os.environ[name] for name in BLAS_THREADS if os.environ.get(name, "").isdigit()), "0")
    threadpool_limits(limits=int(value) or len(os.sched_getaffinity(0)), user_api="blas")


def _exit_status(code) -> int:
    """The status ``sys.exit(code)`` gives a process."""
    if code is None or isinstance(code, int):
        return (code or 0) & 0xFF
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
