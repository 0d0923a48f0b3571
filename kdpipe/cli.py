"""``python -m kdpipe <stage> ...``: one sub-command per workflow stage (the rules call these).

Every stage takes its config slice as ``--params JSON`` (exactly what the rule's ``params`` hold) and explicit
input/output paths. Stage modules are imported only when their sub-command runs. A stage that runs a model
first claims a free GPU from the lock-file pool (:mod:`kdpipe.gpus`), before anything imports torch. A
:class:`KdpipeError` (bad input or configuration) is printed as one clear line and exits with status 2, leaving
no output behind.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from kdpipe.gpus import claim_gpu
from kdpipe.store import KdpipeError

# stages that run no model, so they claim no GPU
NO_DEVICE = frozenset({"prepare", "evaluate-ensemble", "report", "fingerprint", "gather-mc", "gather-logits",
                       "gather-feature", "gather-domain"})


def _params(text: str) -> dict:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise KdpipeError(f"--params is not valid JSON: {err}") from err


def cmd_prepare(a):
    from kdpipe.data import prepare
    prepare(a.params, a.out)


def _optional_path(paths: list[Path] | None) -> Path | None:
    """An input the rule passes only when the job needs it (``--prototypes`` followed by nothing otherwise)."""
    return paths[0] if paths else None


def cmd_prepare_prototypes(a):
    from kdpipe.prototypes import run
    run(a.params, a.data, a.out)


def cmd_finetune_teacher(a):
    from kdpipe.teacher import finetune_teacher
    finetune_teacher(a.params, a.data, a.out, _optional_path(a.prototypes))


def cmd_mc_dropout(a):
    from kdpipe.mc_dropout import run
    run(a.params, a.teacher, a.data, a.out_npy, a.out_parquet)


def cmd_dump_teacher(a):
    from kdpipe.dump import run
    run(a.params, a.teacher, a.data, a.out_logits)


def cmd_dump_feature(a):
    from kdpipe.dump import run_feature
    run_feature(a.params, a.teacher, a.data, a.out_npy)


def cmd_mc_dropout_shard(a):
    from kdpipe.mc_dropout import run_shard
    run_shard(a.params, a.teacher, a.data, a.shard, a.out_part)


def cmd_dump_teacher_shard(a):
    from kdpipe.dump import run_shard
    run_shard(a.params, a.teacher, a.data, a.shard, a.out_part)


def cmd_dump_feature_shard(a):
    from kdpipe.dump import run_feature_shard
    run_feature_shard(a.params, a.teacher, a.data, a.shard, a.out_part)


def cmd_dump_domain_shard(a):
    from kdpipe.domain_dump import run_shard
    run_shard(a.params, a.teacher, a.data, a.shard, a.out_part)


def cmd_gather_domain(a):
    from kdpipe.domain_dump import gather
    gather(a.params, a.parts, a.out_npy)


def cmd_gather_mc(a):
    from kdpipe.mc_dropout import gather
    gather(a.params, a.parts, a.out_npy, a.out_parquet)


def cmd_gather_logits(a):
    from kdpipe.dump import gather
    gather(a.params, a.parts, a.out_logits)


def cmd_gather_feature(a):
    from kdpipe.dump import gather_feature
    gather_feature(a.params, a.parts, a.out_npy)


def cmd_distill(a):
    from kdpipe.distill import distill
    distill(a.params, a.data, a.signals_root, a.out, _optional_path(a.prototypes))


def cmd_cotrain(a):
    from kdpipe.cotrain import cotrain
    cotrain(a.params, a.data, a.out, a.out_teacher)


def cmd_evaluate(a):
    from kdpipe.evaluate import evaluate
    evaluate(a.params, a.model, a.data, a.out_json, a.out_predictions)


def cmd_evaluate_ensemble(a):
    from kdpipe.evaluate import evaluate_ensemble
    evaluate_ensemble(a.params, a.members, a.out_json, a.out_predictions)


def cmd_report(a):
    from kdpipe.report import build_report
    build_report(a.evals, a.out)


def cmd_fingerprint(a):
    from kdpipe.fingerprint import fingerprint, module_closure
    for path in module_closure(*a.modules):
        print(path)
    print(fingerprint(*a.modules))


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kdpipe", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (the rule's {threads})")
    sub = p.add_subparsers(dest="command", required=True)

    def stage(name, fn, *args):
        s = sub.add_parser(name)
        s.set_defaults(fn=fn)
        if name not in ("report", "fingerprint"):
            s.add_argument("--params", type=_params, required=True, help="the stage's config slice as JSON")
        for arg in args:
            s.add_argument(arg, type=Path, required=True)
        return s

    prototypes = dict(nargs="*", type=Path, default=None, help="Meta-KD's prototype scores (when the job needs them)")
    stage("prepare", cmd_prepare, "--out")
    stage("prototypes", cmd_prepare_prototypes, "--data", "--out")
    stage("finetune-teacher", cmd_finetune_teacher, "--data", "--out").add_argument("--prototypes", **prototypes)
    stage("mc-dropout", cmd_mc_dropout, "--teacher", "--data", "--out-npy", "--out-parquet")
    stage("dump-teacher", cmd_dump_teacher, "--teacher", "--data", "--out-logits")
    stage("dump-feature", cmd_dump_feature, "--teacher", "--data", "--out-npy")
    # sharded signal passes (kdpipe.shards): one shard "k-of-S" as a part folder, then the gather of all parts
    for name, fn in (("mc-dropout-shard", cmd_mc_dropout_shard), ("dump-teacher-shard", cmd_dump_teacher_shard),
                     ("dump-feature-shard", cmd_dump_feature_shard), ("dump-domain-shard", cmd_dump_domain_shard)):
        stage(name, fn, "--teacher", "--data", "--out-part").add_argument("--shard", required=True,
                                                                          help="k-of-S (Snakemake's scatteritem)")
    for name, fn, outs in (("gather-mc", cmd_gather_mc, ("--out-npy", "--out-parquet")),
                           ("gather-logits", cmd_gather_logits, ("--out-logits",)),
                           ("gather-feature", cmd_gather_feature, ("--out-npy",)),
                           ("gather-domain", cmd_gather_domain, ("--out-npy",))):
        stage(name, fn, *outs).add_argument("--parts", nargs="+", type=Path, required=True)
    stage("distill", cmd_distill, "--data", "--signals-root", "--out").add_argument("--prototypes", **prototypes)
    stage("cotrain", cmd_cotrain, "--data", "--out", "--out-teacher")
    stage("evaluate", cmd_evaluate, "--model", "--data", "--out-json", "--out-predictions")
    stage("evaluate-ensemble", cmd_evaluate_ensemble, "--out-json", "--out-predictions").add_argument(
        "--members", nargs="+", type=Path, required=True, help="the members' predictions parquet files")
    stage("report", cmd_report, "--out").add_argument("evals", nargs="+", type=Path)
    stage("fingerprint", cmd_fingerprint).add_argument("modules", nargs="+")
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.command not in NO_DEVICE:
            claim_gpu()
        if args.threads:
            from kdpipe.device import set_threads
            set_threads(args.threads)
        args.fn(args)
    except KdpipeError as err:
        print(f"kdpipe {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0
