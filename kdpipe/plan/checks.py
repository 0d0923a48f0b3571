"""Checks of a plan that need more than the schema: names, teachers of each student, heads, stages; then the classes
(:mod:`kdpipe.plan.classes`)."""

from __future__ import annotations

import json
from pathlib import Path

from kdpipe.core.store import KdpipeError
from kdpipe.methods.registry import METHODS, get_method
from kdpipe.models.backbones import refuse_pickle_weights
from kdpipe.plan.entries import NAME, Student, validate_entry
from kdpipe.plan.paths import ORACLE


def check_empty(config: dict) -> None:
    """Refuse an empty list (or ensemble) that the plan would otherwise replace without a word, by a default or by
    every teacher, or that would leave nothing to run: omitting the key is how a config asks for the default."""
    entries = [("teacher_defaults", config.get("teacher_defaults") or {})]
    entries += [(f"teachers.{name}", spec or {}) for name, spec in (config.get("teachers") or {}).items()]
    for where, spec in entries:
        if spec.get("ensemble") == {}:
            raise KdpipeError(
                f"{where}.ensemble: empty, which would mean a single teacher; omit the key for that, or write "
                "{size: N} or {seeds: [0, 1, ...]} for an ensemble"
            )
    defaults = config.get("student_defaults") or {}
    for name, spec in (config.get("students") or {}).items():
        spec = spec or {}
        merged = {**defaults, **spec}
        where = {key: f"students.{name}.{key}" if key in spec else f"student_defaults.{key}" for key in merged}
        method = METHODS.get(merged.get("method", ""))  # an unknown one is named later
        if merged.get("seeds") == []:
            raise KdpipeError(
                f"{where['seeds']}: an empty list would train the student once, with seed {merged.get('seed', 0)}; "
                "omit the key for that, or list the seeds, e.g. [0, 1, 2]"
            )
        if merged.get("teachers") == [] and method is not None and method.teachers:
            raise KdpipeError(
                f"{where['teachers']}: an empty list would mean every teacher; omit the key for that, or name the "
                f"teachers, e.g. [{', '.join(list(config.get('teachers') or {})[:2]) or 'ta, tb'}]"
            )
        init = (merged.get("model") or {}).get("init") or {}
        if init.get("layers") == []:
            raise KdpipeError(
                f"{where['model']}.init.layers: an empty list keeps no layer; omit the key to keep every layer of "
                "the backbone, or list the layers to keep, e.g. [0, 5]"
            )
    if (config.get("evaluate") or {}).get("splits") == []:
        raise KdpipeError(
            "evaluate.splits: an empty list evaluates no model, so the report has nothing to show; omit the key for "
            "[validation, test], or name the splits, e.g. [test]"
        )


class Checks:
    """Mixed into :class:`kdpipe.plan.Plan`: run once when the plan is built, before any job."""

    def _check(self) -> None:
        self._check_own_code()
        if self.schema is not None:
            for kind, entries in (("teacher", self.teachers), ("student", self.students)):
                for name, entry in entries.items():
                    merged = entry.config if kind == "student" else entry
                    validate_entry(merged, self.schema["properties"][f"{kind}_defaults"], f"{kind}s.{name}")
        bases = (set(self.teacher_entries), {s.entry for s in self.students.values()})
        for kind, names in zip(("teachers", "students"), bases):
            for name in names:
                if not NAME.match(name):
                    raise KdpipeError(f"{kind} name {name!r} may use only letters, digits, '_' and '-'")
        clash = bases[0] & bases[1]
        if clash:
            raise KdpipeError(f"{sorted(clash)[0]!r} names both a teacher and a student; names must differ")
        if self.oracle and ORACLE in bases[0] | bases[1]:
            raise KdpipeError(f"{ORACLE!r} is the model name of evaluate.oracle; rename that teacher or student")
        for teacher in self.oracle:
            if teacher not in self.teachers:
                raise KdpipeError(f"evaluate.oracle: unknown teacher {teacher!r}; teachers are {sorted(self.teachers)}")
        for student in self.students.values():
            where = f"students.{student.entry}"
            method = get_method(student.config.get("method", ""))
            for teacher in self.student_teachers(student.name):
                if teacher not in self.teachers:
                    raise KdpipeError(
                        f"{where}.teachers: unknown teacher {teacher!r}; teachers are {sorted(self.teachers)}"
                    )
            self._check_heads(student, method, where)
            self._check_stage(student, method, where)
        self._check_ood()
        self._check_mc_samples()
        self._check_classes()

    def _check_own_code(self) -> None:
        """A local model folder that asks for code of its own (``auto_map`` in its config.json) for a model class
        transformers does not provide, or whose weights are only in a pickle file (``pytorch_model.bin``), stops the
        plan: the job would refuse to load it (:func:`kdpipe.models.loading.refuse_own_code`,
        :func:`kdpipe.models.backbones.refuse_pickle_weights`). Every folder named here is loaded as a sequence
        classifier."""
        folders = {}  # config key -> folder
        for name, spec in self.teachers.items():
            if spec.get("prompt"):  # a causal LM, checked by its own rule (kdpipe.plan.prompted)
                continue
            key = "checkpoint" if spec.get("checkpoint") else "backbone"
            folders[f"teachers.{name.split('.')[0]}.{key}"] = spec.get(key)  # an ensemble member: its entry's key
        folders.update(self._student_sources())
        for where, folder in folders.items():
            if isinstance(folder, str):
                refuse_pickle_weights(folder, where=where)
            if isinstance(folder, str) and _asks_for_own_code(folder):
                from kdpipe.models.loading import refuse_own_code  # torch and transformers: only for such a folder

                refuse_own_code(folder, where=where)

    def _check_stage(self, student: Student, method, where: str) -> None:
        if method.internal and student.name not in self.first_stages:
            raise KdpipeError(
                f"{where}.method: {method.name!r} is the first stage of another method, run by the "
                "plan (e.g. meta_kd); name that method instead"
            )
        if method.teacher_objective:
            for teacher in self.student_teachers(student.name):
                objective = self.teachers[teacher].get("objective", "ce")
                if objective != method.teacher_objective:
                    raise KdpipeError(
                        f"{where}: method {student.config['method']!r} distils teachers trained with "
                        f"objective: {method.teacher_objective}; teacher {teacher!r} has objective: "
                        f"{objective}"
                    )
        if "attentions" in method.signals:
            self.attention_feature(student.name)  # checks attention_heads
        second_stage = student.name in self.first_stages.values()  # its first stage is the one that reads features
        if student.config.get("signals") == "online" and not self.online(student.name) and not second_stage:
            raise KdpipeError(
                f"{where}.signals: online computes the teachers' hidden states and attentions in the student's job; "
                f"method {method.name!r} reads none (only these are ever computed online): remove the key"
            )
        if method.stage == "cotrain" and student.config.get("teachers"):
            raise KdpipeError(
                f"{where}.teachers: method {method.name!r} trains its own teacher from "
                "method_args.backbone; remove `teachers`"
            )
        if not method.teachers and student.config.get("teachers"):
            raise KdpipeError(
                f"{where}.teachers: method {method.name!r} learns from the gold labels alone; remove `teachers`"
            )
        if student.config["model"].get("type") == "bilstm" and ("hidden" in method.signals or method.multihead):
            raise KdpipeError(
                f"{where}.model: a BiLSTM student has no transformer layers or heads; method "
                f"{method.name!r} needs them (use a logit-level method: vanilla_kd, uhc, muki, "
                "dynamic_data, dynamic_teacher, prokt)"
            )

    def _check_heads(self, student: Student, method, where: str) -> None:
        heads = student.config["model"].get("heads")
        if method.multihead and not heads:
            raise KdpipeError(
                f"{where}: method {method.name!r} trains a multi-head student; set model.heads, "
                "e.g. {count: 4, layers: 1}"
            )
        if heads and not method.multihead:
            raise KdpipeError(f"{where}.model.heads: method {method.name!r} trains a single-head student")
        members = len(self.student_teachers(student.name))
        if heads and int(heads.get("count", 0)) > members:
            raise KdpipeError(
                f"{where}.model.heads.count: {heads.get('count')} heads for {members} teachers; "
                "Hydra needs at most one head per ensemble member (M <= N)"
            )


def _asks_for_own_code(folder: str) -> bool:
    """A local model folder whose config.json has an ``auto_map`` (read without transformers)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("auto_map"))
