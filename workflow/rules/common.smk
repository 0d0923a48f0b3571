# Config validation, the experiment plan, per-rule config slices and code fingerprints.
# All logic lives in kdpipe/ (kdpipe.plan is torch-free, so building the DAG stays fast).
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod
from snakemake.utils import validate

from kdpipe import CONFIG_SCHEMA, launch
from kdpipe.core.finished import NO_RESTORE, drop_finished_copies
from kdpipe.core import shared_cache
from kdpipe.core.fingerprint import VERSIONS_ENV, fingerprint
from kdpipe.routing.diagnostics import WARN_ENV
from kdpipe.core.identity import software_versions
from kdpipe.core.store import KdpipeError
from kdpipe.plan.paths import (
    COTRAINED,
    DATA,
    EVAL,
    EXPORTED,
    LLM,
    LOGS,
    OOD_DATA,
    PROTOTYPES,
    REPORT,
    ROUTE,
    SERVING,
    SIGNALS,
    SIGNALS_ROOT,
    STUDENT,
    TEACHER,
    TRANSFER,
    TRAINED_ROOTS,
)
from kdpipe.data.transfer_sources import check_transfer_files
from kdpipe.plan import checked_plan
from kdpipe.plan.prompted import PROMPT_FILES, PROMPT_SIGNALS
from kdpipe.signals.catalog import SIGNALS as SIGNAL_CATALOG, pass_of, signal_files, signal_spec
from kdpipe.stages.catalog import STAGES

try:
    PLAN = checked_plan(
        config,
        CONFIG_SCHEMA,
        lambda: validate(config, schema=str(CONFIG_SCHEMA), set_default=True),
    )
    check_transfer_files(config["dataset"])
    PLAN.check_dump_budget()  # the feature dumps fit their disk budget (kdpipe.plan.budget), before any job
except KdpipeError as err:
    raise WorkflowError(f"config: {err}")

DATASET = PLAN.dataset
SIGNAL_NAMES = list(SIGNAL_CATALOG)
DATA_DIR = DATA.format(dataset=DATASET)
TRANSFER_DIR = TRANSFER.format(dataset=DATASET)
OOD_DIR = OOD_DATA.format(dataset=DATASET)
SIGNAL_SPLITS = "train|validation|test|transfer"  # teachers' signals are computed on the transfer rows too
# Every rule runs `python -m kdpipe <stage>`, importing kdpipe from this workflow's checkout (the folder of kdpipe's
# own Snakefile, two above this file: also when the Snakefile is used as a module of another workflow), whose code
# the rules' fingerprints are computed from, whatever the working directory (-d) and whatever kdpipe is installed:
# the jobs inherit kdpipe.launch's variables, and a job that imports another kdpipe stops
# (docs/design.md, "Which kdpipe a job runs").
CHECKOUT = Path(workflow.current_basedir).resolve().parents[1]
if launch.PACKAGE.parent != CHECKOUT:
    raise WorkflowError(f"this workflow ({CHECKOUT}) imported kdpipe from {launch.PACKAGE}; put its own first")
os.environ.update(launch.job_environment())
# Without a deployment method that `python` is the one running Snakemake (its folder goes first on PATH), so
# `.venv/bin/snakemake` works without activating the venv. With `--software-deployment-method conda` every rule runs
# in envs/kdpipe.yaml instead (ENV, relative to the rule files). The prefix is not part of a rule's shell text, so
# neither path is part of any job's identity (code trigger, output cache).
ENV = "../../envs/kdpipe.yaml"
if DeploymentMethod.CONDA in workflow.deployment_settings.deployment_method:
    shell.prefix("set -euo pipefail; ")
else:
    shell.prefix(f"set -euo pipefail; export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH; ")

# Kept copies of finished training jobs (kdpipe.core.finished) serve only a rerun after a Snakemake that was stopped
# while its jobs ran on: never a run that forces jobs, never an output deleted by hand (onstart), never once a run
# has ended and seen its jobs finish (onsuccess, onerror). Hooks run in the main Snakemake process only.


onstart:
    forced = workflow.dag_settings
    if forced.forceall or forced.forcerun or forced.forcetargets:
        os.environ[NO_RESTORE] = "1"
    drop_finished_copies(TRAINED_ROOTS, keep_if_output_exists=True)


onsuccess:
    drop_finished_copies(TRAINED_ROOTS)


onerror:
    drop_finished_copies(TRAINED_ROOTS)


# With --cache, each cached job holds a lock named by its cache key from its look-up to its store, so that two runs
# sharing the cache make it once (kdpipe.core.shared_cache); a cache folder that cannot take outputs stops the run.
shared_cache.install(workflow)


wildcard_constraints:
    teacher="|".join(map(re.escape, PLAN.teachers)) or "NO_TEACHER",
    student="|".join(map(re.escape, PLAN.students)) or "NO_STUDENT",
    model="|".join(map(re.escape, [*PLAN.teachers, *PLAN.students, *PLAN.cotrained, *PLAN.exported()])),
    ensemble="|".join(map(re.escape, [*PLAN.ensembles, *(["oracle"] if PLAN.oracle else [])])) or "NO_ENSEMBLE",
    split="train|validation|test",


def as_json(obj):
    """A config slice as one JSON string: compared by the params trigger, hashed by the output cache."""
    return json.dumps(obj, sort_keys=True)


def code(stage, *named):
    """Fingerprint of the kdpipe modules a stage uses, so an edit to them reruns the stage (and only it): the stage's
    module with every kdpipe module it imports, plus those it imports by name (given by the plan), named after a ':'
    so that the job fingerprints the same modules again (kdpipe.cli.check_code)."""
    return fingerprint(stage, *named) + (":" + ",".join(named) if named else "")


# The library versions in those fingerprints, for the jobs that check theirs (kdpipe.cli.check_code) in another
# environment
os.environ[VERSIONS_ENV] = json.dumps(software_versions(), sort_keys=True)


def one_of(names):
    """A wildcard constraint matching exactly these names."""
    return "|".join(map(re.escape, names)) or "NO_NAME"


# ---- every stage's rule: its declaration (kdpipe/stages/catalog.py: command, arguments, resources) and its wiring
# here (where its files are, what its config slice and named modules are); workflow/rules/stages.smk makes the rules
STAGE_RULES = []


def stage(
    name,
    doc,
    *,
    outputs,
    log_file,
    cfg,
    modules=(),
    inputs=None,
    args=None,
    rule_name=None,
    wildcards=None,
    cached=False,
    early=False,
    job_size=None,
):
    """Wire the stage ``name`` into the workflow. ``inputs``, ``outputs`` and ``args`` (the params) give its
    arguments by name, and its shell command passes each from where it is; ``cfg`` is its config slice (or a function of the
    wildcards giving it), ``modules`` the kdpipe modules it imports by name (likewise), whose code joins its
    fingerprint. The rule is named after the stage unless ``rule_name`` names it; ``wildcards`` constrains its
    wildcards, ``cached`` puts it in the between-workflow cache, ``early`` runs it before other ready jobs
    (ROUTE_CHAIN_PRIORITY), and ``job_size`` (threads, resources) replaces the declaration's (a whole signal pass
    takes what the profiles set for signal_shard)."""
    declared = STAGES[name]
    inputs, args = dict(inputs or {}), dict(args or {})
    sources = {**{a: "params" for a in args}, **{a: "output" for a in outputs}, **{a: "input" for a in inputs}}
    at = lambda value: value if callable(value) else (lambda wc: value)
    config, named = at(cfg), at(modules)
    gpu = {"gpu": 1} if declared.model else {}
    if declared.trains:  # a training job's one wildcard names its model: one process per device it asks for
        gpu = {"gpu": lambda wc: PLAN.devices(wc[0])}
    size = job_size or (declared.threads, {"mem_mb": declared.mem_mb, "runtime": declared.runtime, **gpu})
    STAGE_RULES.append(
        {
            "name": rule_name or declared.rule,
            "doc": doc,
            "input": inputs,
            "output": outputs,
            "log": log_file,
            "wildcard_constraints": wildcards or {},
            "cache": cached,
            "priority": ROUTE_CHAIN_PRIORITY if early else 0,
            "threads": size[0],
            "resources": size[1],
            "params": {
                **args,
                "cfg": lambda wc: as_json(config(wc)),
                "code": lambda wc: code(declared.module, *named(wc)),
            },
            "shell": declared.shell(sources),
        }
    )


def model_dir(wildcards):
    return PLAN.model_dir(wildcards.model)


# The report's routing files, when some student reads a route (workflow/rules/evaluate.smk)
ROUTING_REPORT = (
    {
        "routing": report(f"{REPORT}/routing.tsv", caption="../report/routing.rst", category="Routing"),
        "routing_md": f"{REPORT}/routing.md",
        "routing_plot": report(f"{REPORT}/routing.png", caption="../report/routing.rst", category="Routing"),
    }
    if PLAN.routes()
    else {}
)
# The exported models' table, when some exported student is evaluated; the serving table, when some model is profiled
EXPORTED_REPORT = {
    **(
        {
            "exported": report(f"{REPORT}/exported.tsv", caption="../report/exported.rst", category="Summary"),
            "exported_md": f"{REPORT}/exported.md",
        }
        if PLAN.evaluated_exports()
        else {}
    ),
    **(
        {
            "serving": report(f"{REPORT}/serving.tsv", caption="../report/serving.rst", category="Summary"),
            "serving_md": f"{REPORT}/serving.md",
        }
        if PLAN.serving_models()
        else {}
    ),
}
# The uncertainty split, only when some model averages several members or heads (an ensemble, a multi-head student)
TRANSFER_REPORT = (
    {"transfer": report(f"{REPORT}/transfer.png", caption="../report/transfer.rst", category="Summary")}
    if PLAN.has_transfer_students()
    else {}
)
UNCERTAINTY_REPORT = (
    {"uncertainty": report(f"{REPORT}/uncertainty.png", caption="../report/uncertainty.rst", category="Calibration")}
    if PLAN.has_members()
    else {}
)
# The out-of-distribution table and figures, and the risk–coverage curves, when OOD rows are evaluated (split "ood")
OOD_REPORT = (
    {
        "ood": report(f"{REPORT}/ood.tsv", caption="../report/ood_tsv.rst", category="OOD and selective prediction"),
        "ood_md": f"{REPORT}/ood.md",
        "ood_roc": report(
            f"{REPORT}/ood_roc.png", caption="../report/ood_roc.rst", category="OOD and selective prediction"
        ),
        "risk_coverage": report(
            f"{REPORT}/risk_coverage.png",
            caption="../report/risk_coverage.rst",
            category="OOD and selective prediction",
        ),
    }
    if PLAN.has_ood()
    else {}
)


# ---- teacher signals (workflow/rules/signals.smk)
scattergather:
    mc_dropout=PLAN.shards("mc_dropout"),
    dump=PLAN.shards("dump"),


def shard_count(signal):
    """S, the shard jobs the pass of ``signal`` runs as: ``--set-scatter`` wins over the config's section."""
    section = signal_spec(signal).shards
    return int(workflow.resource_settings.overwrite_scatter.get(section, PLAN.shards(section)))


# Which passes run whole (S = 1: one job that writes its signals) and which as shards and gathers (kdpipe/plan/passes.py)
PASSES_WHOLE = {signals: pairs for signals, pairs in PLAN.passes().items() if shard_count(signals[0]) == 1}
SIGNALS_SHARDED = [name for name in SIGNAL_NAMES if shard_count(name) > 1]
PASSES_SHARDED = sorted({pass_of(name) for name in SIGNALS_SHARDED})
# one shard's part folder (a temp output): a sub-folder per signal of the pass
PART = f"{SIGNALS}/shards/{{pass_name}}.{{scatteritem}}"
# The signal folder a whole pass writes into, in its shell command (which cannot name a loop variable: Snakemake
# formats it when the job runs)
PASS_FOLDER = SIGNALS.format(teacher="{wildcards.teacher}", split="{wildcards.split}")
PASS_RULE_JOIN = "+"
# A whole pass is a shard job that writes its artifacts itself, in rules named after their signals (which the config
# decides): it runs with the threads and resources a profile sets for signal_shard.
PASS_THREADS = workflow.resource_settings.overwrite_threads.get("signal_shard", 2)
# MC-dropout passes and routes run before other jobs that are ready: the students that read a route wait on them, and
# started last they leave one core idle at the end of the run (Snakemake runs higher priorities first)
ROUTE_CHAIN_PRIORITY = 1
# The threshold of the routing warning a route job says as soon as it has routed, and each student that reads the
# route before it trains (routing.warn_below, the report's setting): in the jobs' environment, in no rule's params or
# shell text, so that a change reruns no route and no student (kdpipe.routing.diagnostics.WARN_ENV)
os.environ[WARN_ENV] = str(config["routing"]["warn_below"])


def rule_resource(resource):
    """A value a profile gives with set-resources (a Snakemake Resource: a number, a string, or an expression such
    as `attempt * 120`) as a rule's own `resources:` take it: the value, or a function Snakemake calls per job."""
    if not resource.is_evaluable():
        return resource.value

    def value(wildcards, input, attempt, threads, rulename, async_run):
        aux = dict(input=input, attempt=attempt, threads=threads, rulename=rulename, async_run=async_run)
        return resource.evaluate(wildcards, **aux).value

    return value


PASS_RESOURCES = {
    "mem_mb": 6000,
    "runtime": 120,
    "gpu": 1,
    **{
        name: rule_resource(value)
        for name, value in workflow.resource_settings.overwrite_resources.get("signal_shard", {}).items()
    },
}


def signal_params(wildcards, signal):
    """The config slice of one signal of one teacher on one split."""
    return as_json(PLAN.signal_params(wildcards.teacher, wildcards.split, signal))


def signal_outputs(signal):
    """The files of a signal, as the catalog names them, each named by what follows its stem (npy, parquet, json;
    offsets_npy, tokens_npy for a feature dump's sidecars)."""
    return {"_".join(Path(file).name.split(".")[1:]): file for file in signal_files(signal, SIGNALS)}


def pass_rule(signals):
    """The name of a whole pass's rule, its signals joined by "+" (e.g. ``logits+pooled+hidden``)."""
    return PASS_RULE_JOIN.join(signals)


def pass_outputs(signals):
    """The files of every signal a whole pass makes, named ``<signal>_<what follows its stem>`` (logits_parquet...;
    the between-workflow cache needs names)."""
    return {f"{signal}_{name}": file for signal in signals for name, file in signal_outputs(signal).items()}


def pair_constraints(pairs):
    """Wildcard constraints under which a pass's signal paths match exactly these (teacher, split) pairs, since
    another pass may make other signals of the same teacher on another split. The teacher's pattern looks ahead at
    the split that follows it in the path."""
    return {
        "teacher": "|".join(f"{re.escape(t)}(?=/{re.escape(s)}/)" for t, s in pairs),
        "split": one_of(sorted({split for _, split in pairs})),
    }


def shard_signals(wildcards):
    """The signals a shard job's pass makes of its teacher on its split."""
    return PLAN.pass_signals(wildcards.teacher, wildcards.split, wildcards.pass_name)


def gather_parts(wildcards, signal):
    """The part folders of every shard of a signal's pass (as many as its config section's shards)."""
    part = PART.format(
        pass_name=pass_of(signal), teacher=wildcards.teacher, split=wildcards.split, scatteritem="{scatteritem}"
    )
    return getattr(gather, signal_spec(signal).shards)(part)


# ---- prompted teachers' passes (workflow/rules/signals.smk)
PROMPT_PAIRS = PLAN.prompt_passes()
# Where a prompted teacher exists, the classifier teachers' signal rules are kept off its signal paths
CLASSIFIER_TEACHERS = {"teacher": one_of(PLAN.classifier_teachers())} if PLAN.prompted_teachers() else {}
# one shard's part folder of a prompted pass (a temp output): logits/, mc/ and prompt/
PROMPT_PART = f"{SIGNALS}/shards/prompt.{{scatteritem}}"


def prompt_outputs():
    """The files a prompted pass writes: its logits and mc signals' (named as a whole pass's are) and its members'
    probabilities, ``prompt.npy`` and ``prompt.json``."""
    members = {f"prompt_{Path(name).suffix[1:]}": f"{SIGNALS}/{name}" for name in PROMPT_FILES}
    return {**pass_outputs(list(PROMPT_SIGNALS)), **members}


PROMPT_OUTPUTS = prompt_outputs()


def prompt_parts(wildcards):
    """The part folders of every shard of a prompted pass (as many as the dump section's shards)."""
    part = PROMPT_PART.format(teacher=wildcards.teacher, split=wildcards.split, scatteritem="{scatteritem}")
    return gather.dump(part)
