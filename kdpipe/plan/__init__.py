"""The experiment plan: from a validated config to jobs, their config slices and the artifact paths.

Imported by the workflow (``workflow/rules/common.smk``) when Snakemake builds the DAG, so it stays free of torch
and transformers. :func:`checked_plan` checks a config and makes its :class:`Plan`, which gathers one mixin per
concern, each a module of this package (docs/design.md, "Layers", lists them).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import yaml

from kdpipe.core.store import KdpipeError
from kdpipe.data.settings import DatasetSettings
from kdpipe.data.transfer_sources import has_transfer
from kdpipe.methods.registry import NO_UNLABELLED_ROWS, TEACHER_OBJECTIVES, complete_args, get_method
from kdpipe.models.settings import StudentModel
from kdpipe.plan.budget import Budget
from kdpipe.plan.checks import Checks, check_empty
from kdpipe.plan.classes import Classes
from kdpipe.plan.entries import Student, ensemble_seeds, split_stages, validate_entry
from kdpipe.plan.exports import Exports
from kdpipe.plan.layers import Layers
from kdpipe.plan.numbers import check_numbers
from kdpipe.plan.ood import OOD_SPLIT, Ood
from kdpipe.plan.passes import Passes
from kdpipe.plan.paths import (
    COTRAINED,
    DATA,
    EVAL,
    EXPORTED,
    ORACLE,
    PROTOTYPES,
    REPORT,
    SERVING,
    SIGNALS,
    STUDENT,
    TEACHER,
    TRANSFER,
)
from kdpipe.plan.prompted import Prompted, check_prompted_entry
from kdpipe.plan.routes import Routes
from kdpipe.plan.slices import Slices
from kdpipe.signals.catalog import FEATURES, signal_files

TRANSFER_SPLIT = "transfer"  # the split of the transfer rows (kdpipe.data.dataset.TRANSFER, without pandas)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: ten times faster


class Plan(Budget, Checks, Classes, Exports, Layers, Ood, Passes, Prompted, Routes, Slices):
    def __init__(self, config: dict, schema: dict | None = None):
        """``config`` with its defaults filled in; ``schema`` (the config schema) validates merged entries."""
        check_empty(config)
        self.config = config
        self.schema = schema
        self.dataset = config["dataset"]["name"]
        self.teachers: dict[str, dict] = {}
        self.ensembles: dict[str, list[str]] = {}  # ensemble name -> member teacher names
        self.teacher_entries = list(config.get("teachers") or {})  # names as written (ensembles unexpanded)
        for name, spec in (config.get("teachers") or {}).items():
            merged = {**config.get("teacher_defaults", {}), **(spec or {})}
            if merged.get("prompt"):
                check_prompted_entry(merged, f"teachers.{name}")
            objective = TEACHER_OBJECTIVES.get(merged.get("objective", "ce"))
            if objective:  # its arguments checked and completed with their declared defaults
                where = f"teachers.{name}.objective_args"
                merged["objective_args"] = complete_args(objective.args, merged.get("objective_args"), where)
            ensemble = merged.pop("ensemble", None)
            if not ensemble:
                self.teachers[name] = merged
                continue
            seeds = ensemble_seeds(ensemble, f"teachers.{name}.ensemble")
            self.ensembles[name] = [f"{name}.seed{seed}" for seed in seeds]
            for member, seed in zip(self.ensembles[name], seeds):
                self.teachers[member] = {**merged, "seed": seed}
        if not self.teachers:
            raise KdpipeError("'teachers' is empty; name at least one teacher")
        self.students: dict[str, Student] = {}
        self._domains: list[str] | None = None
        self._labels: list[str] | None = None  # the dataset's labels (kdpipe.plan.classes), read when first needed
        self._classes: dict[str, list[str]] = {}
        for entry, spec in (config.get("students") or {}).items():
            merged = {**config.get("student_defaults", {}), **(spec or {})}
            seeds = merged.pop("seeds", None) or [merged.get("seed", 0)]
            for base, domain in self._per_domain(entry, merged):
                for seed in seeds:
                    name = base if len(seeds) == 1 else f"{base}.seed{seed}"
                    self.students[name] = Student(name, base, int(seed), {**merged, **domain, "seed": int(seed)}, entry)
        # A two-stage method (Meta-KD) runs its first stage as a job of its own, "<student>.stage1", not evaluated
        self.first_stages: dict[str, str] = {}
        for name, student in list(self.students.items()):
            first_stage = get_method(student.config.get("method", "")).first_stage
            if first_stage:
                first, second = split_stages(student, first_stage)
                self.students[first.name], self.students[name] = first, second
                self.first_stages[first.name] = name
        # ProKT students train a teacher of their own; it is evaluated as the model "<student>.teacher"
        self.cotrained = {
            f"{name}.teacher": name
            for name, s in self.students.items()
            if get_method(s.config.get("method", "")).stage == "cotrain"
        }
        # the teachers' oracle (evaluate.oracle): each row to the teacher that owns its gold class
        self.oracle: list[str] = list(config["evaluate"].get("oracle") or [])
        self._check()
        # method_args: checked against the method's declaration and completed with its defaults
        for name, student in self.students.items():
            where = f"students.{student.entry}.method_args" + (".stage1" if name in self.first_stages else "")
            method = get_method(student.config.get("method", ""))
            declared = tuple(arg for arg in method.args if not (method.first_stage and arg.name == "stage1"))
            student.config["method_args"] = complete_args(declared, student.config.get("method_args"), where)
        self._check_prompted()  # (after method_args: a route's router is one of them)

    def _per_domain(self, entry: str, merged: dict) -> list[tuple[str, dict]]:
        """(base name, domain key) of each student an entry stands for: itself, or one ``<entry>.<domain>`` per domain
        with ``per_domain: true`` (popped from ``merged``)."""
        if not merged.pop("per_domain", False):
            return [(entry, {})]
        if merged.get("domain"):
            raise KdpipeError(f"students.{entry}: set domain or per_domain, not both")
        tags: dict[str, str] = {}
        for domain in self.data_domains(f"students.{entry}.per_domain"):
            tag = re.sub(r"[^A-Za-z0-9_-]", "_", domain)
            if tag in tags:
                raise KdpipeError(
                    f"students.{entry}.per_domain: domains {tags[tag]!r} and {domain!r} give the same "
                    f"job name {entry}.{tag}; rename one"
                )
            tags[tag] = domain
        return [(f"{entry}.{tag}", {"domain": domain}) for tag, domain in tags.items()]

    def data_domains(self, where: str) -> list[str]:
        """The domains of the dataset, read from its source file(s) when the DAG is built (only for per_domain)."""
        if self._domains is None:
            from kdpipe.data.prepare import source_domains

            self._domains = source_domains(self.dataset_settings(), where)
        return self._domains

    # ---- lookups
    def student_teachers(self, student: str) -> list[str]:
        """The teachers a student learns from; an ensemble's name stands for all its members."""
        config = self.students[student].config
        method = get_method(config.get("method", ""))
        if method.stage == "cotrain" or not method.teachers:
            return []
        named = config.get("teachers") or list(self.teachers)
        return [member for name in named for member in self.ensembles.get(name, [name])]

    def models(self) -> list[str]:
        """Everything evaluated: teachers, ensembles, the oracle, students (not a first stage) and exports."""
        students = [name for name in self.students if name not in self.first_stages]
        combined = [*self.ensembles, *([ORACLE] if self.oracle else [])]
        return [*self.teachers, *combined, *students, *self.cotrained, *self.evaluated_exports()]

    def combined(self, model: str) -> list[str]:
        """The members of a model made from other models' predictions: an ensemble, or the teachers' oracle."""
        return self.oracle if model == ORACLE else self.ensembles[model]

    def stage_students(self, stage: str) -> list[str]:
        """The students trained by rule ``stage`` (``distill`` or ``cotrain``)."""
        return [name for name, s in self.students.items() if get_method(s.config["method"]).stage == stage]

    def model_dir(self, model: str) -> str:
        if model in self.teachers and self.prompted(model):
            return self.llm_dir(model)
        if model in self.teachers:
            return TEACHER.format(teacher=model)
        if model in self.cotrained:
            return COTRAINED.format(student=self.cotrained[model])
        if model in self.exported():
            return EXPORTED.format(model=model)
        return STUDENT.format(student=model)

    def signal_files(self, student: str) -> list[str]:
        """The cached signal files a student's method reads of each of its teachers, on the train split and on the
        transfer split when it learns from transfer rows."""
        splits = ["train", *([TRANSFER_SPLIT] if self.student_transfer(student) else [])]
        signals = get_method(self.students[student].config["method"]).signals
        return [
            path
            for teacher in self.student_teachers(student)
            for split in splits
            for signal in (self.attention_feature(student) if s == "attentions" else s for s in signals)
            if not (self.online(student) and signal in FEATURES)  # signals: online computes these (plan.budget)
            for path in signal_files(signal, SIGNALS.format(teacher=teacher, split=split))
        ]

    # ---- transfer rows (kdpipe.data.transfer)
    def has_transfer(self) -> bool:
        dataset = self.config["dataset"]
        return has_transfer(dataset.get("transfer"), dataset.get("split", {}).get("unlabelled", 0))

    def dataset_settings(self) -> DatasetSettings:
        """The config's ``dataset`` section as the data layer reads it (without its transfer keys)."""
        return DatasetSettings.of_section(self.config["dataset"])

    def student_model(self, student: str) -> StudentModel:
        """A student's ``model`` entry as the models layer reads it."""
        entry = self.students[student]
        return StudentModel.from_params(entry.config["model"], f"students.{entry.entry}.model")

    def student_transfer(self, student: str) -> float:
        """The share of the transfer rows a student learns from (``students.<name>.transfer``): by default all of
        them where its method and the student can use them; an explicit share where they cannot is an error."""
        config = self.students[student].config
        share = config.get("transfer")
        method = get_method(config["method"])
        oracle = method.routed and config["method_args"].get("router") == "oracle"  # routes by each gold label
        if share is None:
            usable = method.unlabelled and not config.get("domain") and not oracle
            return 1.0 if self.has_transfer() and usable else 0.0
        if share and oracle:
            raise KdpipeError(
                f"students.{self.students[student].entry}.transfer is {share}, but its router oracle routes each row "
                "by its gold label, which transfer rows do not have; choose another router, or set transfer: 0"
            )
        if share and not self.has_transfer():
            raise KdpipeError(
                f"students.{self.students[student].entry}.transfer is {share}, but the dataset has no transfer rows: "
                "set dataset.transfer or dataset.split.unlabelled"
            )
        if share and not method.unlabelled:
            raise KdpipeError(
                f"students.{self.students[student].entry}.transfer is {share}, but method {method.name} learns from "
                f"no row without a gold label ({NO_UNLABELLED_ROWS.get(method.name, 'it reads gold labels')}); "
                "set transfer: 0 or leave it out"
            )
        if share and config.get("domain"):
            raise KdpipeError(
                f"students.{self.students[student].entry}.transfer is {share}, but a per-domain student trains on its "
                "domain's rows and transfer rows have no domain; set transfer: 0 or leave it out"
            )
        return float(share)

    def has_transfer_students(self) -> bool:
        """Some evaluated student learns from transfer rows: the report then draws the transfer curve."""
        return any(self.student_transfer(s) for s in self.students if s not in self.first_stages)

    def transfer_inputs(self, student: str) -> list[str]:
        """The transfer artifact, for a student that learns from transfer rows."""
        return [TRANSFER.format(dataset=self.dataset)] if self.student_transfer(student) else []

    def split_data(self, split: str) -> str:
        """The artifact holding a split's rows: the prepared dataset, or the transfer rows."""
        return TRANSFER.format(dataset=self.dataset) if split == TRANSFER_SPLIT else DATA.format(dataset=self.dataset)

    def prototype_files(self, student: str) -> list[str]:
        """Meta-KD's prototype scores, for a student whose method reads them."""
        return [PROTOTYPES] if get_method(self.students[student].config["method"]).prototypes else []

    def init_dirs(self, student: str) -> list[str]:
        """The first stage's output, which the second stage of a two-stage student starts from."""
        return [STUDENT.format(student=first) for first, second in self.first_stages.items() if second == student]

    def teacher_prototype_files(self, teacher: str) -> list[str]:
        """The prototype scores a meta-teacher weights its examples by (none for a plain teacher)."""
        spec = self.teachers[teacher]
        weighted = (spec.get("objective_args") or {}).get("sample_weights", True)
        return [PROTOTYPES] if spec.get("objective", "ce") == "meta" and weighted else []

    def _reads(self, student: str, signal: str) -> bool:
        return signal in get_method(self.students[student].config["method"]).signals

    def mc_splits(self) -> list[str]:
        return list(self.config["mc_dropout"].get("splits") or [])

    def eval_splits(self) -> list[str]:
        """The splits every model is evaluated on (``evaluate.splits``), then the OOD rows (``evaluate.ood``)."""
        return [*self.config["evaluate"]["splits"], *([OOD_SPLIT] if self.has_ood() else [])]

    def trained_models(self) -> list[str]:
        """The folders of every evaluated model that has one (not an ensemble, not a prompted teacher): the report
        reads their training logs."""
        made = (*self.ensembles, ORACLE, *self.exported(), *self.prompted_teachers())
        return [self.model_dir(model) for model in self.models() if model not in made]

    def has_members(self) -> bool:
        """Some evaluated model averages several members or heads: only then does the report draw uncertainty.png."""
        heads = (s.config["model"].get("heads") or {} for name, s in self.students.items())
        prompts = any(self.prompt_members_count(t) > 1 for t in self.prompted_teachers())
        return bool(self.ensembles) or prompts or any(int(h.get("count", 1)) > 1 for h in heads)

    def report_title(self) -> str:
        """The report's title: ``report.title``, or one naming the dataset."""
        return self.config["report"]["title"] or f"Distillation on {self.config['dataset']['name']}"

    def targets(self) -> list[str]:
        """What ``rule all`` asks for: every evaluation, the report, and the configured MC-dropout signals."""
        out = [f"{REPORT}/summary.md"]
        for model in self.models():
            out += [f"{EVAL.format(model=model, split=split)}.json" for split in self.eval_splits()]
        for teacher in self.teachers:
            for split in self.mc_splits():
                out += signal_files("mc", SIGNALS.format(teacher=teacher, split=split))[:1]
        return out + [SERVING.format(model=model) for model in self.serving_models()]


def checked_plan(config: dict, schema_path: Path, snakemake_validate: Callable[[], None]) -> Plan:
    """The :class:`Plan` of a config that has passed every check of its entries (docs/configuration.md), with the
    schema's defaults filled into ``config`` in place by ``snakemake_validate`` (Snakemake's check of ``config``).
    Raises :class:`~kdpipe.core.store.KdpipeError` naming the first refused key."""
    schema = yaml.load(schema_path.read_bytes(), Loader=LOADER)
    check_numbers(config, schema)  # before the schema, which refuses lr: 1e-3 (text to YAML) without saying why
    validate_entry(config, schema)  # one line naming the key (Snakemake's check below prints the schema entry)
    snakemake_validate()
    return Plan(config, schema)
