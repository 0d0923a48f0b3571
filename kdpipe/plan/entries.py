"""From config entries to jobs: students per seed and per domain, ensembles of teachers, two-stage students."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdpipe.core.store import KdpipeError
from kdpipe.plan.paths import STUDENT

NAME = re.compile(r"^[A-Za-z0-9_-]+$")  # teacher and student names (they become file and job names)


@dataclass
class Student:
    name: str  # job name: the base name, or "<base>.seed<N>" when the student has several seeds
    base: str  # the entry's name, or "<entry>.<domain>" for one of a per_domain entry's students
    seed: int
    config: dict  # student_defaults merged with the student's own keys (without "seeds", "per_domain")
    entry: str = ""  # the name as written under `students`


# Training settings that a first stage may set apart from the student's own (``method_args.stage1``).
STAGE_SETTINGS = ("epochs", "lr", "batch_size", "warmup_ratio", "weight_decay", "max_grad_norm", "checkpoint_every")


def split_stages(student: Student, first_stage: str) -> tuple[Student, Student]:
    """A two-stage student as two jobs: ``<name>.stage1`` (method ``first_stage``, with the training settings and
    method_args of ``method_args.stage1``) and ``<name>``, which starts from the first stage's weights and keeps the
    other method_args (so a change to the second stage reruns only it)."""
    args = dict(student.config.get("method_args") or {})
    stage1 = dict(args.pop("stage1", None) or {})
    settings = {k: stage1.pop(k) for k in STAGE_SETTINGS if k in stage1}
    first_name = f"{student.name}.stage1"
    first = Student(
        first_name,
        student.base,
        student.seed,
        {**student.config, **settings, "method": first_stage, "method_args": stage1},
        student.entry,
    )
    second = Student(
        student.name,
        student.base,
        student.seed,
        {**student.config, "method_args": args, "model": {"init": {"from": STUDENT.format(student=first_name)}}},
        student.entry,
    )
    return first, second


def validate_entry(entry: dict, schema: dict, where: str = "") -> None:
    """Stop at the first value ``schema`` refuses, with one line naming its full key (``where`` and the path in
    ``entry``); run on the whole config before Snakemake's own check, which prints the schema entry too."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(entry), key=lambda e: list(map(str, e.path)))
    if errors:
        err = errors[0]
        key = ".".join([*([where] if where else []), *map(str, err.path)])
        raise KdpipeError(f"{key}: {err.message}" if key else err.message)


def ensemble_seeds(spec: dict, where: str) -> list[int]:
    """The member seeds of ``ensemble: {size: N}`` (seeds 0..N-1) or ``{seeds: [...]}``."""
    seeds = spec.get("seeds")
    if seeds is None:
        seeds = list(range(int(spec.get("size") or 0)))
    if spec.get("size") is not None and int(spec["size"]) != len(seeds):
        raise KdpipeError(f"{where}: size {spec['size']} but {len(seeds)} seeds {seeds}")
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise KdpipeError(f"{where}: an ensemble needs at least 2 distinct seeds, got {seeds}")
    return [int(s) for s in seeds]


def without(mapping: dict, *keys: str) -> dict:
    """A copy without ``keys``: settings that choose *which* jobs run must not be part of each job's slice."""
    return {k: v for k, v in mapping.items() if k not in keys}
