"""The workflow's stages: one module per stage, each with one entry point ``run(params, **arguments)``.

``params`` is the stage's config slice (exactly what the rule's ``params.cfg`` holds, computed by
:mod:`kdpipe.plan`); the arguments are the rule's input and output paths. :data:`STAGES` is the one table the
command line (:mod:`kdpipe.cli`) is built from. Teacher-side stages (prepare, transfer, finetune_teacher,
import_teacher, prototypes, signal_pass, signal_shard, signal_gather, route) import nothing of the student side
(methods, student architectures, distill): a change there never reruns a teacher job (docs/caching-and-reruns.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    module: str
    arguments: tuple[str, ...]  # "name": a path; "name?": a path the rule passes only when the job needs it;
    # "name+": one or more paths; "name*": zero or more; "name:str": a string; "name:str?": an optional string
    device: bool = True  # runs a model: claims a GPU from the pool first
    summary: str = ""
    trains: bool = False  # a training job: a rerun of the same job restores its finished outputs (kdpipe.cli)


# name: (its arguments, runs a model, what it does); the module is kdpipe.stages.<name with "_" for "-">
_TABLE = {
    "prepare": ("out", False, "read, deduplicate and split the dataset"),
    "transfer": ("data out", False, "unlabelled transfer rows, checked against the dataset"),
    "ood": ("data out transfer?", False, "an external out-of-distribution set, checked against the dataset"),
    "prototypes": ("data out", True, "Meta-KD's prototype scores"),
    "finetune-teacher": ("data out prototypes?", True, "fine-tune one teacher"),
    "import-teacher": ("data out", True, "use a fine-tuned checkpoint as a teacher, without training"),
    "signal-pass": ("teacher data out", True, "a teacher signal pass over a whole split, writing its signals"),
    "signal-shard": ("teacher data shard:str out_part", True, "one shard of a teacher signal pass"),
    "signal-gather": ("parts+ out", False, "a teacher signal from its shards"),
    "route": ("data signals_root out warn_below:str?", False, "each row's teacher weights, with routing diagnostics"),
    "route-transfer": ("data transfer signals_root route", False, "a route's teacher weights of the transfer rows"),
    "distill": (
        "data signals_root out prototypes? route? transfer? teacher_dirs* warn_below:str?",
        True,
        "train a student from cached signals",
    ),
    "cotrain": ("data out out_teacher", True, "ProKT: a student and its teacher trained together"),
    "evaluate": (
        "model data ood? out_json+ out_predictions+",
        True,
        "metrics and predictions of one model, split by split",
    ),
    "evaluate-ensemble": ("members+ out_json+ out_predictions+", False, "an ensemble from its members' predictions"),
    "report": ("evals+ out routes* models* title:str?", False, "summary tables and plots"),
    "predict": (
        "model input out text_column:str? text_pair_column:str? batch_size:str?",
        True,
        "labels and probabilities of a trained model for every row of a CSV/TSV/JSONL/Parquet file",
    ),
}
TRAINING = ("finetune-teacher", "distill", "cotrain")
# Every stage takes the rule's code fingerprint (``--code {params.code}``): a job whose code is no longer the code
# it was scheduled with stops (kdpipe.cli.check_code). The training jobs have an identity (kdpipe.core.identity):
# they take the rule's declared inputs too (``--inputs {input}``), whose checksums are part of it, with the code
# fingerprint (a stage called without it uses its module's). The stage's ``run`` gets neither.
CODE = ("code:str?",)
IDENTITY = ("inputs*",)
STAGES = {
    name: Stage(
        f"kdpipe.stages.{name.replace('-', '_')}",
        tuple(arguments.split()) + (IDENTITY if name in TRAINING else ()) + CODE,
        device,
        summary,
        name in TRAINING,
    )
    for name, (arguments, device, summary) in _TABLE.items()
}
