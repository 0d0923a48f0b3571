"""Every stage of the workflow, declared once (docs/design.md, "Stages"; docs/adding-a-stage.md).

A :class:`Stage` names its sub-command (``python -m kdpipe <name>``), the function that does its work, its
arguments and its resources; from it come the command line (:mod:`kdpipe.cli`) and each rule's shell command and
resources (``workflow/rules/common.smk``). Torch-free, and imported by no stage, so that a change here reruns only
the jobs whose command line it changes (the shell command is part of a rule's code).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Arg:
    """One argument of a stage: the flag ``--<name>`` (``_`` written ``-``) and the keyword its function takes."""

    name: str
    kind: str = "path"  # "path", "paths" (one or more), "text"
    optional: bool = False  # the rule passes it only when the job needs it: the function then gets None ([] for paths)
    output: bool = False  # the job writes it (a training job locks it and keeps a finished copy of it)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Stage:
    """A stage: its sub-command, the ``module:function`` that does its work, what it does, its arguments, the
    ``module:class`` of its typed settings and its rule's resources (threads, memory in MB, run time in minutes)."""

    name: str
    entry: str
    summary: str
    args: tuple[Arg, ...]
    settings: str
    model: bool = False  # runs a model: claims a GPU from the pool first, and asks the workflow for one
    trains: bool = False  # a training job: has an identity, resumes, restores its finished outputs (kdpipe.cli)
    threads: int = 1
    mem_mb: int = 2000
    runtime: int = 10

    @property
    def module(self) -> str:
        """The module of the stage's function: the root of the job's code fingerprint."""
        return self.entry.partition(":")[0]

    @property
    def function(self) -> str:
        return self.entry.partition(":")[2]

    def settings_type(self) -> type:
        """The class of the stage's typed settings (imported here, by name)."""
        module, _, name = self.settings.partition(":")
        return getattr(importlib.import_module(module), name)

    @property
    def rule(self) -> str:
        """The name of its rule, unless the workflow names the rule otherwise (a signal pass by its signals)."""
        return self.name.replace("-", "_")

    def shell(self, sources: dict[str, str]) -> str:
        """The rule's shell command: ``sources`` says which of ``input``, ``output`` or ``params`` holds each
        argument (an optional argument without a source is left out); a training job also gets ``--inputs`` (part
        of its identity) and ``--processes``."""
        words = ["python -m kdpipe --threads {threads}"]
        if self.trains:
            words.append("--processes {resources.gpu}")
        words += ["--log {log:q}", self.name, "--params {params.cfg:q} --code {params.code}"]
        for arg in self.args:
            if arg.name in sources:
                words.append(f"{arg.flag} {{{sources[arg.name]}.{arg.name}:q}}")
            elif not arg.optional:
                raise ValueError(f"stage {self.name}: the rule gives no value for --{arg.name}")
        if self.trains:
            words.append("--inputs {input:q}")
        return " ".join(words)


def read(name: str, *, optional: bool = False, many: bool = False) -> Arg:
    """A path the job reads (``many``: one or more; ``optional``: given only when the job needs it)."""
    return Arg(name, "paths" if many else "path", optional)


def written(name: str, *, many: bool = False) -> Arg:
    """A path the job writes (``many``: one per split)."""
    return Arg(name, "paths" if many else "path", output=True)


def text(name: str) -> Arg:
    """An optional text (a title, a column name, a number written as text)."""
    return Arg(name, "text", optional=True)


MODEL = dict(model=True, threads=2, mem_mb=6000, runtime=120)  # a stage that runs a model, on a GPU where one is
CPU_MODEL = dict(threads=2, mem_mb=6000, runtime=30)  # one that runs a model on the CPU alone (exports, profiles)
TRAINING = dict(MODEL, trains=True)
DATA, OUT = read("data"), written("out")

# fmt: off
SIGNALS_ROOT, TEACHER, MODEL_DIR = read("signals_root"), read("teacher"), read("model")
OPTIONAL = {n: read(n, optional=True) for n in ("prototypes", "route", "transfer", "ood", "reference", "shots")}
PER_SPLIT = (written("out_json", many=True), written("out_predictions", many=True))  # an evaluation's files
STAGES = {stage.name: stage for stage in (
    Stage("prepare", "kdpipe.data.prepare:prepare", "read, deduplicate and split the dataset", (OUT,),
          "kdpipe.data.settings:DatasetSettings"),
    Stage("transfer", "kdpipe.data.transfer:build_transfer", "unlabelled transfer rows, checked against the dataset",
          (DATA, OUT), "kdpipe.data.settings:TransferSettings", runtime=30),
    Stage("ood", "kdpipe.data.ood:build_ood", "an external out-of-distribution set, checked against the dataset",
          (DATA, OPTIONAL["transfer"], OUT), "kdpipe.data.settings:OodSourceSettings"),
    Stage("prototypes", "kdpipe.methods.meta_kd.prototypes:write_prototype_scores", "Meta-KD's prototype scores",
          (DATA, OUT), "kdpipe.methods.meta_kd.settings:PrototypeSettings", **MODEL),
    Stage("finetune-teacher", "kdpipe.stages.finetune_teacher:run", "fine-tune one teacher",
          (DATA, OPTIONAL["prototypes"], OUT), "kdpipe.training.settings:TeacherSettings", **TRAINING),
    Stage("import-teacher", "kdpipe.stages.import_teacher:run",
          "use a fine-tuned checkpoint as a teacher, without training", (DATA, OUT),
          "kdpipe.training.settings:ImportedTeacherSettings", **dict(MODEL, runtime=60)),
    Stage("llm-import", "kdpipe.models.causal_lm:import_llm",
          "a prompted teacher's causal language model imported once as safetensors", (OUT,),
          "kdpipe.models.causal_lm_source:CausalLmImportSettings", threads=2, mem_mb=8000, runtime=60),
    Stage("prompt-pass", "kdpipe.signals.prompted:run_pass",
          "a prompted teacher's pass over a whole split, writing its logits, mc and prompt members",
          (MODEL_DIR, DATA, OPTIONAL["shots"], OUT),
          "kdpipe.signals.prompt_settings:PromptPassSettings", **MODEL),
    Stage("prompt-shard", "kdpipe.signals.prompted:run_shard", "one shard of a prompted teacher's pass",
          (MODEL_DIR, DATA, OPTIONAL["shots"], Arg("shard", "text"), written("out_part")),
          "kdpipe.signals.prompt_settings:PromptPassSettings", **MODEL),
    Stage("prompt-gather", "kdpipe.signals.prompt_members:gather",
          "a prompted teacher's logits, mc and prompt members from its shards", (read("parts", many=True), OUT),
          "kdpipe.signals.prompt_settings:PromptPassSettings", mem_mb=4000, runtime=30),
    Stage("signal-pass", "kdpipe.signals.shards:run_pass",
          "a teacher signal pass over a whole split, writing its signals", (TEACHER, DATA, OUT),
          "kdpipe.signals.settings:PassSettings", **MODEL),
    Stage("signal-shard", "kdpipe.signals.shards:run_shard", "one shard of a teacher signal pass",
          (TEACHER, DATA, Arg("shard", "text"), written("out_part")), "kdpipe.signals.settings:PassSettings",
          **MODEL),
    Stage("signal-gather", "kdpipe.signals.shards:gather", "a teacher signal from its shards",
          (read("parts", many=True), OUT), "kdpipe.signals.settings:SignalSettings", mem_mb=4000, runtime=30),
    Stage("route", "kdpipe.routing.build:build_route", "each row's teacher weights, with routing diagnostics",
          (DATA, SIGNALS_ROOT, OUT, text("warn_below")), "kdpipe.routing.settings:RouteSettings", threads=2,
          mem_mb=4000, runtime=30),
    Stage("route-transfer", "kdpipe.routing.transfer:route_transfer",
          "a route's teacher weights of the transfer rows", (DATA, read("transfer"), SIGNALS_ROOT, written("route")),
          "kdpipe.routing.settings:RouteSettings", threads=2, mem_mb=4000, runtime=30),
    Stage("distill", "kdpipe.stages.distill:run", "train a student from cached signals",
          (DATA, SIGNALS_ROOT, OPTIONAL["prototypes"], OPTIONAL["route"], OPTIONAL["transfer"],
           read("teacher_dirs", optional=True, many=True), text("warn_below"), OUT),
          "kdpipe.methods.settings:StudentSettings", **TRAINING),
    Stage("cotrain", "kdpipe.stages.cotrain:run", "ProKT: a student and its teacher trained together",
          (DATA, OUT, written("out_teacher")), "kdpipe.methods.settings:StudentSettings",
          **dict(TRAINING, mem_mb=8000, runtime=240)),
    Stage("evaluate", "kdpipe.stages.evaluate:run", "metrics and predictions of one model, split by split",
          (MODEL_DIR, DATA, OPTIONAL["ood"], OPTIONAL["reference"], *PER_SPLIT),
          "kdpipe.evaluation.settings:EvalSettings", **dict(MODEL, mem_mb=4000, runtime=60)),
    Stage("evaluate-prompted", "kdpipe.stages.evaluate_prompted:run",
          "a prompted teacher's metrics and predictions from its passes' prompt members",
          (DATA, read("members", many=True), *PER_SPLIT),
          "kdpipe.evaluation.settings:EvalSettings"),
    Stage("evaluate-ensemble", "kdpipe.stages.evaluate_ensemble:run", "an ensemble from its members' predictions",
          (read("members", many=True), *PER_SPLIT),
          "kdpipe.evaluation.settings:EvalSettings"),
    Stage("report", "kdpipe.report:write_report", "summary tables and plots",
          (read("evals", many=True), read("routes", optional=True, many=True), read("models", optional=True, many=True),
           read("serving", optional=True, many=True), text("title"), OUT),
          "kdpipe.report.settings:ReportSettings"),
    Stage("export", "kdpipe.stages.export:export", "a trained student as an ONNX graph, checked against it",
          (MODEL_DIR, DATA, OUT), "kdpipe.models.settings:ExportSettings", **CPU_MODEL),
    Stage("quantize", "kdpipe.stages.export:quantize",
          "an ONNX graph quantised to int8, with its accuracy check on the validation rows",
          (MODEL_DIR, DATA, OUT), "kdpipe.models.settings:QuantizeSettings", **CPU_MODEL),
    Stage("serve", "kdpipe.stages.export:serve", "a model's serving profile: latency, throughput, memory and size",
          (MODEL_DIR, DATA, OUT), "kdpipe.models.settings:ServingSettings", **CPU_MODEL),
    Stage("predict", "kdpipe.stages.predict:run",
          "labels and probabilities of a trained model for every row of a CSV/TSV/JSONL/Parquet file",
          (MODEL_DIR, read("input"), *map(text, ("text_column", "text_pair_column", "batch_size", "encoding")),
           OUT),
          "kdpipe.stages.predict:PredictSettings", **MODEL),
)}
# fmt: on
