"""``python -m kdpipe <stage> ...``: one sub-command per workflow stage (the rules call these).

Built from :data:`kdpipe.stages.catalog.STAGES` (docs/design.md, "Style"): a stage's ``--params`` slice is read once
into its typed settings, its module imported only when its sub-command runs; a job checks its code fingerprint
(:func:`check_code`), claims a GPU before torch is imported when it runs a model (docs/design.md, "Compute"), and
with ``--processes N`` becomes ``torchrun`` (:func:`_launch`). A :class:`KdpipeError` is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

from kdpipe.core.finished import job_identity_of_process, set_job_identity
from kdpipe.core.gpus import claim_gpu
from kdpipe.core.identity import check_local_content
from kdpipe.core.killed import end_if_interrupted, say_when_killed
from kdpipe.core.progress import log_to, peak_memory_mb, rows_done, summary_line
from kdpipe.core.settings import Settings
from kdpipe.core.store import KdpipeError
from kdpipe.launch import pause, snapshot
from kdpipe.stages.catalog import STAGES, Arg, Stage


def _params(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from err


def _add_argument(sub: argparse.ArgumentParser, arg: Arg) -> None:
    """An optional path or paths may be given with no value (the rule always writes the flag)."""
    if arg.kind == "text":
        sub.add_argument(arg.flag, dest=arg.name, required=not arg.optional, default=None)
    elif arg.optional:
        many = arg.kind == "paths"
        sub.add_argument(arg.flag, dest=arg.name, nargs="*" if many else "?", type=Path, default=[] if many else None)
    else:
        sub.add_argument(arg.flag, dest=arg.name, nargs="+" if arg.kind == "paths" else None, type=Path, required=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kdpipe", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (the rule's {threads})")
    p.add_argument(
        "--processes",
        type=int,
        default=1,
        help="a training stage's processes, one per device, data-parallel (the rule's {resources.gpu})",
    )
    p.add_argument("--log", type=Path, default=None, help="write everything into this file (the rule's {log})")
    sub = p.add_subparsers(dest="command", required=True)
    for name, stage in STAGES.items():
        s = sub.add_parser(name, help=stage.summary)
        s.add_argument("--params", type=_params, default={}, help="the stage's config slice as JSON")
        s.add_argument("--code", default=None, help="the code fingerprint the workflow computed")
        if stage.trains:
            s.add_argument("--inputs", nargs="*", type=Path, default=[], help="the rule's inputs: the job's identity")
        for arg in stage.args:
            _add_argument(s, arg)
    return p


def _made_already(stage: Stage, settings: Settings, args: dict, inputs: list[Path], code: str | None) -> bool:
    """Lock a training job's outputs, set its identity and say whether its finished outputs were restored."""
    from kdpipe.core.fingerprint import fingerprint
    from kdpipe.core.finished import lock_outputs, restore_finished
    from kdpipe.core.identity import job_identity

    outputs = [Path(args[arg.name]) for arg in stage.args if arg.output]
    if not inputs:  # called by hand, without the rule's --inputs: the paths it reads
        read = [args[arg.name] for arg in stage.args if arg.kind != "text" and not arg.output and args[arg.name]]
        inputs = [Path(p) for value in read for p in (value if isinstance(value, list) else [value])]
    lock_outputs(outputs)
    identity = job_identity(settings, inputs, code or fingerprint(stage.module))
    set_job_identity(identity)
    return restore_finished(identity, outputs)


def _check_local_content(params: dict) -> None:
    """Stop a job whose local files changed since the plan digested them (:func:`kdpipe.core.identity.
    check_local_content`), reading the paths its slice names as the plan does."""
    planned = params.get("local_content")
    if planned:
        from kdpipe.plan.slices import named_paths

        check_local_content(planned, named_paths({k: v for k, v in params.items() if k != "local_content"}))


def check_code(stage: Stage, code: str) -> None:
    """Stop a job whose code (the snapshot it runs from, :mod:`kdpipe.launch`) is not what its fingerprint ``code``
    was computed from (``--code``: the fingerprint, then after a ``:`` the modules the stage imports by name)."""
    from kdpipe.core.fingerprint import VERSIONS_ENV, fingerprint, read_sources_from

    taken = snapshot()
    if taken is not None:
        read_sources_from(taken.sources)
    try:  # the workflow's library versions: a job in another environment (conda) compares the code alone
        versions = json.loads(os.environ[VERSIONS_ENV])
    except (KeyError, ValueError):
        versions = None
    expected, _, named = code.partition(":")
    here = fingerprint(stage.module, *filter(None, named.split(",")), versions=versions)
    if here != expected:
        raise KdpipeError(
            f"the kdpipe code changed after this job was scheduled (code fingerprint {expected} then, {here} now); "
            "nothing was run: rerun Snakemake, which schedules the job again with the code as it is now"
        )


# Set for the ranks that _launch starts: the launcher holds the output lock and knows the job's identity
LAUNCHED = "KDPIPE_LAUNCHED_IDENTITY"


def _launch(processes: int, threads: int | None, command: str, argv: list[str]) -> None:
    """Become ``torchrun`` running this same command as ``processes`` ranks, the output lock held across the exec."""
    from kdpipe.core.finished import held_locks

    rest = argv[argv.index(command) :]  # (the launcher's own options, which come first, dropped: the ranks get theirs)
    per_rank = max(1, (threads or os.cpu_count() or 1) // processes)
    for handle in held_locks():  # held by torchrun, then, until the job ends
        os.set_inheritable(handle.fileno(), True)
    os.environ[LAUNCHED] = job_identity_of_process() or ""
    os.environ["OMP_NUM_THREADS"] = str(per_rank)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    command += ["-m", "kdpipe", "--threads", str(per_rank), *rest]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def job_name(command: str, params: dict, args: dict) -> str:
    """What a job's summary line calls it: ``logits+pooled minilm_a/train``, ``mc minilm_a/train shard 2-of-4``,
    ``evaluate vkd/validation,test``, ``distill vkd`` (any other job: its command and output folder)."""
    slices = params.get("signals") or ([params] if "signal" in params else [])
    if command in ("signal-pass", "signal-shard", "signal-gather") and slices:
        teacher = Path(args["teacher"]).name if args.get("teacher") else Path(args["out"]).parent.name
        signals = "+".join(s["signal"] for s in slices)
        name = f"{signals}{' gather' if command == 'signal-gather' else ''} {teacher}/{slices[0].get('split')}"
        return name + (f" shard {args['shard']}" if args.get("shard") not in (None, "1-of-1") else "")
    if command in ("evaluate", "evaluate-ensemble") and "model" in params:
        return f"{command} {params['model']}/{','.join(params.get('splits') or [])}"
    out = next((v for n, v in args.items() if n.startswith("out") and isinstance(v, Path)), args.get("route"))
    name = Path(out).name if out is not None else command  # (route-transfer writes into its route's folder)
    return command if name == command else f"{command} {name}"


def _use_threads(threads: int, stage: Stage) -> None:
    """torch's CPU threads (``OMP_NUM_THREADS`` for a stage that has not imported torch, which takes seconds)."""
    if stage.model or "torch" in sys.modules:
        from kdpipe.core.device import set_threads

        set_threads(threads)
    else:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def main(argv=None) -> int:
    """The command line ``kdpipe COMMAND ...``, its exit status; with ``argv`` None a Ctrl-C ends the process by
    SIGINT without a traceback (kdpipe.core.killed)."""
    try:
        return _main(sys.argv[1:] if argv is None else list(argv))
    except KeyboardInterrupt:
        if argv is None:
            end_if_interrupted()
        raise


def _main(argv: list[str]) -> int:
    args = vars(parser().parse_args(argv))
    log = args.pop("log")
    if log is not None:
        log_to(log)
    if not sys.stderr.isatty():  # a job's log: the libraries' own bars (loading, saving weights) redraw in it
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    command, threads, params = args.pop("command"), args.pop("threads"), args.pop("params")
    processes, code, inputs = args.pop("processes"), args.pop("code"), args.pop("inputs", [])
    stage = STAGES[command]
    rank = LAUNCHED in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1
    say_when_killed(job_name(command, params, args))  # (kdpipe.core.killed)
    try:
        if processes < 1:
            raise KdpipeError(f"--processes {processes}: give at least 1")
        _check_local_content(params)
        if code:
            check_code(stage, code)
        settings = stage.settings_type().from_params(params, "--params")  # (the one place a job reads the slice)
        if rank:  # one of several ranks: the launcher took the lock and checked for finished outputs
            set_job_identity(os.environ[LAUNCHED] or None)
        elif stage.trains and _made_already(stage, settings, args, inputs, code):
            return 0
        elif stage.trains and processes > 1:
            _launch(processes, threads, command, argv)
        if stage.model:
            claim_gpu()
        from kdpipe.core.memory import use_system_allocator

        use_system_allocator()  # (memory flat in N: docs/design.md, "Compute")
        function = getattr(importlib.import_module(stage.module), stage.function)
        if threads:
            _use_threads(threads, stage)
        if rank:
            from kdpipe.core.device import pick_device
            from kdpipe.training import distributed

            distributed.init(pick_device())
        pause("run")
        started, rows = time.perf_counter(), rows_done()
        function(settings, **args)
        if not rank or int(os.environ.get("RANK", "0")) == 0:  # the job's summary: docs/design.md, "Compute"
            seconds = time.perf_counter() - started  # (the stage's own, without the start-up)
            line = summary_line(job_name(command, params, args), rows_done() - rows, seconds, peak_memory_mb())
            print(line, file=sys.stderr, flush=True)
        if rank:
            distributed.close()
    except KdpipeError as err:
        print(f"kdpipe {command}: error: {err}", file=sys.stderr)
        return 2
    return 0
