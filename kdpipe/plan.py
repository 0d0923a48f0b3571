"""The experiment plan: from a validated config to jobs, their config slices and the artifact paths.

Imported by the workflow (``workflow/rules/common.smk``) when Snakemake builds the DAG, so it must stay free of
torch and transformers. Each ``*_params`` method returns exactly the slice of the config that the stage's output
depends on (DESIGN.md, "Rerun rules"): plain JSON-able values, never the whole config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdpipe.backbones import num_layers, strided_alignment, student_layers
from kdpipe.methods.registry import get_method
from kdpipe.store import KdpipeError

NAME = re.compile(r"^[A-Za-z0-9_-]+$")

DATA = "results/data/{dataset}"
TEACHER = "results/teachers/{teacher}"
SIGNALS = "results/signals/{teacher}/{split}"
STUDENT = "results/students/{student}"
EVAL = "results/eval/{model}/{split}"
REPORT = "results/report"
LOGS = "results/logs"


@dataclass
class Student:
    name: str          # job name: the base name, or "<base>.seed<N>" when the student has several seeds
    base: str
    seed: int
    config: dict       # student_defaults merged with the student's own keys (without "seeds")


class Plan:
    def __init__(self, config: dict, schema: dict | None = None):
        """``config`` with its defaults filled in; ``schema`` (the config schema) validates merged entries."""
        self.config = config
        self.schema = schema
        self.dataset = config["dataset"]["name"]
        self.teachers = {name: {**config.get("teacher_defaults", {}), **(spec or {})}
                         for name, spec in (config.get("teachers") or {}).items()}
        if not self.teachers:
            raise KdpipeError("config: 'teachers' is empty; name at least one teacher")
        self.students: dict[str, Student] = {}
        for base, spec in (config.get("students") or {}).items():
            merged = {**config.get("student_defaults", {}), **(spec or {})}
            seeds = merged.pop("seeds", None) or [merged.get("seed", 0)]
            for seed in seeds:
                name = base if len(seeds) == 1 else f"{base}.seed{seed}"
                self.students[name] = Student(name, base, int(seed), {**merged, "seed": int(seed)})
        self._check()

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        if self.schema is not None:
            for kind, entries in (("teacher", self.teachers), ("student", self.students)):
                for name, entry in entries.items():
                    merged = entry.config if kind == "student" else entry
                    _validate(merged, self.schema["properties"][f"{kind}_defaults"], f"{kind}s.{name}")
        for kind, names in (("teachers", self.teachers), ("students", {s.base for s in self.students.values()})):
            for name in names:
                if not NAME.match(name):
                    raise KdpipeError(f"config: {kind} name {name!r} may use only letters, digits, '_' and '-'")
        clash = set(self.teachers) & {s.base for s in self.students.values()}
        if clash:
            raise KdpipeError(f"config: {sorted(clash)[0]!r} names both a teacher and a student; names must differ")
        for student in self.students.values():
            where = f"students.{student.base}"
            method = get_method(student.config.get("method", ""))
            for teacher in self.student_teachers(student.name):
                if teacher not in self.teachers:
                    raise KdpipeError(f"{where}.teachers: unknown teacher {teacher!r}; teachers are "
                                      f"{sorted(self.teachers)}")
            self._check_explicit_overlap(student, method.teacher_classes, where)

    def _check_explicit_overlap(self, student: Student, policy: str, where: str) -> None:
        """Overlap of explicitly listed classes is visible before any data is read; catch it at once."""
        if policy in ("any", "identical"):
            return
        owner: dict[str, str] = {}
        for teacher in self.student_teachers(student.name):
            classes = self.teachers[teacher].get("classes")
            if not isinstance(classes, list):
                continue
            for c in classes:
                if c in owner:
                    raise KdpipeError(f"{where}: teachers {owner[c]!r} and {teacher!r} both cover class {c!r}, but "
                                      f"method {student.config['method']!r} needs {policy.replace('_', ' ')} "
                                      "class subsets")
                owner[c] = teacher

    # ------------------------------------------------------------------ lookups
    def student_teachers(self, student: str) -> list[str]:
        return list(self.students[student].config.get("teachers") or self.teachers)

    def models(self) -> list[str]:
        return [*self.teachers, *self.students]

    def model_dir(self, model: str) -> str:
        if model in self.teachers:
            return TEACHER.format(teacher=model)
        return STUDENT.format(student=model)

    def signal_files(self, student: str) -> list[str]:
        """The cached signal files a student's method reads (train split), for each of its teachers."""
        method = get_method(self.students[student].config["method"])
        files = []
        for teacher in self.student_teachers(student):
            root = SIGNALS.format(teacher=teacher, split="train")
            if "logits" in method.signals:
                files += [f"{root}/logits.parquet", f"{root}/logits.json"]
            if "mc" in method.signals:
                files += [f"{root}/mc.npy", f"{root}/mc.parquet", f"{root}/mc.json"]
            if "hidden" in method.signals:
                files += [f"{root}/hidden.npy", f"{root}/hidden.json"]
        return files

    def alignment(self, student: str) -> dict[str, list[list[int]]] | None:
        """For methods reading teacher hidden states: per teacher, the (student, teacher) hidden-state index pairs
        (``method_args.align_number`` pairs from the last layer backwards, METHODS.md §1 DFA)."""
        config = self.students[student].config
        if "hidden" not in get_method(config["method"]).signals:
            return None
        count = (config.get("method_args") or {}).get("align_number", -1)
        n_student = student_layers(config["model"])
        return {t: [list(pair) for pair in strided_alignment(num_layers(self.teachers[t]["backbone"]), n_student, count)]
                for t in self.student_teachers(student)}

    def feature_layers(self, teacher: str) -> list[int]:
        """Teacher hidden-state indices any student needs from ``teacher`` (the dump keeps only these)."""
        layers = set()
        for name in self.students:
            for t, pairs in (self.alignment(name) or {}).items():
                if t == teacher:
                    layers.update(tl for _, tl in pairs)
        return sorted(layers)

    def method_module(self, student: str) -> str:
        return get_method(self.students[student].config["method"]).module

    def mc_splits(self) -> list[str]:
        return list(self.config["mc_dropout"].get("splits") or [])

    def targets(self) -> list[str]:
        """What ``rule all`` asks for: every evaluation, the report, and the configured MC-dropout signals."""
        out = [f"{REPORT}/summary.md"]
        for model in self.models():
            out += [f"{EVAL.format(model=model, split=split)}.json" for split in self.eval_splits()]
        for teacher in self.teachers:
            for split in self.mc_splits():
                out.append(f"{SIGNALS.format(teacher=teacher, split=split)}/mc.npy")
        return out

    def eval_splits(self) -> list[str]:
        return list(self.config["evaluate"]["splits"])

    # ------------------------------------------------------------------ config slices
    def prepare_params(self) -> dict:
        return dict(self.config["dataset"])

    def teacher_params(self, teacher: str) -> dict:
        return dict(self.teachers[teacher])

    def mc_params(self, split: str) -> dict:
        return {**_without(self.config["mc_dropout"], "splits"), "split": split}

    def dump_params(self, split: str) -> dict:
        return {**self.config["dump"], "split": split}

    def student_params(self, student: str) -> dict:
        params = {**self.students[student].config, "teachers": self.student_teachers(student)}
        alignment = self.alignment(student)
        if alignment:
            params["alignment"] = alignment
        return params

    def feature_params(self, teacher: str, split: str, feature: str) -> dict:
        return {**self.config["dump"], "split": split, "feature": feature, "layers": self.feature_layers(teacher)}

    def eval_params(self, model: str, split: str) -> dict:
        student = self.students.get(model)
        return {"model": model, "base": student.base if student else model,
                "kind": "student" if student else "teacher",
                "method": student.config["method"] if student else None,
                "seed": student.seed if student else self.teachers[model].get("seed"),
                "split": split, **_without(self.config["evaluate"], "splits")}


def _validate(entry: dict, schema: dict, where: str) -> None:
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(entry), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        key = ".".join([where, *map(str, err.path)])
        raise KdpipeError(f"{key}: {err.message}")


def _without(mapping: dict, *keys: str) -> dict:
    """A copy without ``keys``: settings that choose *which* jobs run must not be part of each job's slice."""
    return {k: v for k, v in mapping.items() if k not in keys}
