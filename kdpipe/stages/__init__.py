"""The workflow's stages: one module per stage, each with one entry point ``run(params, **arguments)``.

``params`` is the stage's config slice (exactly what the rule's ``params.cfg`` holds, computed by
:mod:`kdpipe.plan`); the arguments are the rule's input and output paths. :data:`STAGES` is the one table the
command line (:mod:`kdpipe.cli`) is built from. Teacher-side stages (prepare, finetune_teacher, prototypes,
signal_shard, signal_gather) import nothing of the student side (methods, student architectures, distill): a change
there never reruns a teacher job (docs/caching-and-reruns.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    module: str
    arguments: tuple[str, ...]  # "name": a path; "name?": a path the rule passes only when the job needs it;
    # "name+": one or more paths; "name:str": a string
    device: bool = True  # runs a model: claims a GPU from the pool first
    summary: str = ""


STAGES = {
    "prepare": Stage(
        "kdpipe.stages.prepare", ("out",), device=False, summary="read, deduplicate and split the dataset"
    ),
    "prototypes": Stage("kdpipe.stages.prototypes", ("data", "out"), summary="Meta-KD's prototype scores"),
    "finetune-teacher": Stage(
        "kdpipe.stages.finetune_teacher", ("data", "out", "prototypes?"), summary="fine-tune one teacher"
    ),
    "signal-shard": Stage(
        "kdpipe.stages.signal_shard",
        ("teacher", "data", "shard:str", "out_part"),
        summary="one shard of a teacher signal pass",
    ),
    "signal-gather": Stage(
        "kdpipe.stages.signal_gather", ("parts+", "out"), device=False, summary="a teacher signal from its shards"
    ),
    "distill": Stage(
        "kdpipe.stages.distill",
        ("data", "signals_root", "out", "prototypes?"),
        summary="train a student from cached signals",
    ),
    "cotrain": Stage(
        "kdpipe.stages.cotrain",
        ("data", "out", "out_teacher"),
        summary="ProKT: a student and its teacher trained together",
    ),
    "evaluate": Stage(
        "kdpipe.stages.evaluate",
        ("model", "data", "out_json", "out_predictions"),
        summary="metrics and predictions of one model on one split",
    ),
    "evaluate-ensemble": Stage(
        "kdpipe.stages.evaluate_ensemble",
        ("members+", "out_json", "out_predictions"),
        device=False,
        summary="an ensemble from its members' predictions",
    ),
    "report": Stage("kdpipe.stages.report", ("evals+", "out"), device=False, summary="summary tables and plots"),
}
