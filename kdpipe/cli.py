"""``python -m kdpipe <stage> ...``: one sub-command per workflow stage (the rules call these).

Built from :data:`kdpipe.stages.STAGES`. Every stage takes its config slice as ``--params JSON`` (exactly what the
rule's ``params`` hold) and explicit input/output paths. A stage's module is imported only when its sub-command
runs. A stage that runs a model first claims a free GPU from the lock-file pool (:mod:`kdpipe.core.gpus`), before
anything imports torch. A :class:`KdpipeError` (bad input or configuration) is printed as one clear line and exits
with status 2, leaving no output behind.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from kdpipe.core.gpus import claim_gpu
from kdpipe.core.store import KdpipeError
from kdpipe.stages import STAGES


def _params(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not valid JSON: {err}") from err


def _add_argument(sub: argparse.ArgumentParser, spec: str) -> None:
    name, kind = (spec.split(":") + ["path"])[:2]
    many = name[-1] if name[-1] in "?+*" else ""
    name = name.rstrip("?+*")
    flag = "--" + name.replace("_", "-")
    if kind.startswith("str"):  # "str": required, "str?": optional
        sub.add_argument(flag, dest=name, required=not kind.endswith("?"), default=None)
    elif many in "?*" and many:  # the rule writes the flag always, followed by the path(s) the job needs, if any
        sub.add_argument(flag, dest=name, nargs="*", type=Path, default=[])
    else:
        sub.add_argument(flag, dest=name, nargs="+" if many else None, type=Path, required=True)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kdpipe", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (the rule's {threads})")
    sub = p.add_subparsers(dest="command", required=True)
    for name, stage in STAGES.items():
        s = sub.add_parser(name, help=stage.summary)
        s.add_argument("--params", type=_params, default={}, help="the stage's config slice as JSON")
        for spec in stage.arguments:
            _add_argument(s, spec)
    return p


def _restored(params: dict, args: dict) -> bool:
    """A training job whose outputs were finished by this same job (same settings, inputs and code) but then
    deleted as incomplete (Snakemake stopped before it noticed the job end) gets them back at once; otherwise the
    job's identity is set, so that its outputs are kept for such a rerun (kdpipe.training.loop.finish)."""
    from kdpipe.core.checksums import job_identity
    from kdpipe.core.finished import lock_outputs, restore_finished, set_job_identity

    paths = {name: value for name, value in args.items() if value is not None}
    outputs = [Path(v) for name, v in paths.items() if name.startswith("out")]
    inputs = [p for name, v in paths.items() if not name.startswith("out") for p in (v if isinstance(v, list) else [v])]
    lock_outputs(outputs)
    identity = job_identity(params, inputs)
    if restore_finished(identity, outputs):
        return True
    set_job_identity(identity)
    return False


def main(argv=None) -> int:
    args = vars(parser().parse_args(argv))
    command, threads, params = args.pop("command"), args.pop("threads"), args.pop("params")
    stage = STAGES[command]
    for spec in stage.arguments:  # an optional path not given is None
        name = spec.split(":")[0]
        if name.endswith("?") and not spec.endswith(":str?"):
            given = args[name[:-1]]
            args[name[:-1]] = given[0] if given else None
    try:
        if stage.trains and _restored(params, args):
            return 0
        if stage.device:
            claim_gpu()
        if threads:
            from kdpipe.core.device import set_threads

            set_threads(threads)
        importlib.import_module(stage.module).run(params, **args)
    except KdpipeError as err:
        print(f"kdpipe {command}: error: {err}", file=sys.stderr)
        return 2
    return 0
