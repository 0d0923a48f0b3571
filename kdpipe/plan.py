"""The experiment plan: from a validated config to jobs, their config slices and the artifact paths.

Imported by the workflow (``workflow/rules/common.smk``) when Snakemake builds the DAG, so it must stay free of
torch and transformers. Each ``*_params`` method returns exactly the slice of the config that the stage's output
depends on (DESIGN.md, "Rerun rules"): plain JSON-able values, never the whole config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kdpipe.backbones import num_heads, num_layers, strided_alignment, student_heads, student_layers, uniform_alignment
from kdpipe.methods.registry import TEACHER_OBJECTIVES, get_method
from kdpipe.store import KdpipeError

NAME = re.compile(r"^[A-Za-z0-9_-]+$")

DATA = "results/data/{dataset}"
TEACHER = "results/teachers/{teacher}"
SIGNALS = "results/signals/{teacher}/{split}"
STUDENT = "results/students/{student}"
COTRAINED = "results/cotrained/{student}"     # ProKT's teacher, trained with the student (evaluated as "<student>.teacher")
PROTOTYPES = "results/prototypes/train.parquet"   # Meta-KD's prototype scores of the train rows (+ train.json)
EVAL = "results/eval/{model}/{split}"
REPORT = "results/report"
LOGS = "results/logs"


@dataclass
class Student:
    name: str          # job name: the base name, or "<base>.seed<N>" when the student has several seeds
    base: str          # the entry's name, or "<entry>.<domain>" for one of a per_domain entry's students
    seed: int
    config: dict       # student_defaults merged with the student's own keys (without "seeds", "per_domain")
    entry: str = ""    # the name as written under `students`


class Plan:
    def __init__(self, config: dict, schema: dict | None = None):
        """``config`` with its defaults filled in; ``schema`` (the config schema) validates merged entries."""
        self.config = config
        self.schema = schema
        self.dataset = config["dataset"]["name"]
        self.teachers: dict[str, dict] = {}
        self.ensembles: dict[str, list[str]] = {}     # ensemble name -> member teacher names
        self.teacher_entries = list(config.get("teachers") or {})   # names as written (ensembles unexpanded)
        for name, spec in (config.get("teachers") or {}).items():
            merged = {**config.get("teacher_defaults", {}), **(spec or {})}
            ensemble = merged.pop("ensemble", None)
            if not ensemble:
                self.teachers[name] = merged
                continue
            seeds = _ensemble_seeds(ensemble, f"teachers.{name}.ensemble")
            self.ensembles[name] = [f"{name}.seed{seed}" for seed in seeds]
            for member, seed in zip(self.ensembles[name], seeds):
                self.teachers[member] = {**merged, "seed": seed}
        if not self.teachers:
            raise KdpipeError("config: 'teachers' is empty; name at least one teacher")
        self.students: dict[str, Student] = {}
        self._domains: list[str] | None = None
        for entry, spec in (config.get("students") or {}).items():
            merged = {**config.get("student_defaults", {}), **(spec or {})}
            seeds = merged.pop("seeds", None) or [merged.get("seed", 0)]
            for base, domain in self._per_domain(entry, merged):
                for seed in seeds:
                    name = base if len(seeds) == 1 else f"{base}.seed{seed}"
                    self.students[name] = Student(name, base, int(seed), {**merged, **domain, "seed": int(seed)},
                                                  entry)
        # A two-stage method (Meta-KD) runs its first stage as a job of its own, "<student>.stage1", not evaluated
        self.first_stages: dict[str, str] = {}
        for name, student in list(self.students.items()):
            first_stage = get_method(student.config.get("method", "")).first_stage
            if first_stage:
                first, second = _split_stages(student, first_stage)
                self.students[first.name], self.students[name] = first, second
                self.first_stages[first.name] = name
        # ProKT students train a teacher of their own; it is evaluated as the model "<student>.teacher"
        self.cotrained = {f"{name}.teacher": name for name, s in self.students.items()
                          if get_method(s.config.get("method", "")).stage == "cotrain"}
        self._check()

    def _per_domain(self, entry: str, merged: dict) -> list[tuple[str, dict]]:
        """(base name, domain key) of each student an entry stands for: itself, or with ``per_domain: true`` one
        student ``<entry>.<domain>`` per domain of the data (``merged`` loses the key)."""
        if not merged.pop("per_domain", False):
            return [(entry, {})]
        if merged.get("domain"):
            raise KdpipeError(f"students.{entry}: set domain or per_domain, not both")
        tags: dict[str, str] = {}
        for domain in self.data_domains(f"students.{entry}.per_domain"):
            tag = re.sub(r"[^A-Za-z0-9_-]", "_", domain)
            if tag in tags:
                raise KdpipeError(f"students.{entry}.per_domain: domains {tags[tag]!r} and {domain!r} give the same "
                                  f"job name {entry}.{tag}; rename one")
            tags[tag] = domain
        return [(f"{entry}.{tag}", {"domain": domain}) for tag, domain in tags.items()]

    def data_domains(self, where: str) -> list[str]:
        """The domains of the dataset, read from its source file(s) when the DAG is built (only for per_domain)."""
        if self._domains is None:
            from kdpipe.data import source_domains
            self._domains = source_domains(self.config["dataset"], where)
        return self._domains

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        if self.schema is not None:
            for kind, entries in (("teacher", self.teachers), ("student", self.students)):
                for name, entry in entries.items():
                    merged = entry.config if kind == "student" else entry
                    _validate(merged, self.schema["properties"][f"{kind}_defaults"], f"{kind}s.{name}")
        bases = (set(self.teacher_entries), {s.entry for s in self.students.values()})
        for kind, names in zip(("teachers", "students"), bases):
            for name in names:
                if not NAME.match(name):
                    raise KdpipeError(f"config: {kind} name {name!r} may use only letters, digits, '_' and '-'")
        clash = bases[0] & bases[1]
        if clash:
            raise KdpipeError(f"config: {sorted(clash)[0]!r} names both a teacher and a student; names must differ")
        for student in self.students.values():
            where = f"students.{student.entry}"
            method = get_method(student.config.get("method", ""))
            for teacher in self.student_teachers(student.name):
                if teacher not in self.teachers:
                    raise KdpipeError(f"{where}.teachers: unknown teacher {teacher!r}; teachers are "
                                      f"{sorted(self.teachers)}")
            self._check_explicit_overlap(student, method.teacher_classes, where)
            self._check_heads(student, method, where)
            self._check_stage(student, method, where)

    def _check_stage(self, student: Student, method, where: str) -> None:
        if method.internal and student.name not in self.first_stages:
            raise KdpipeError(f"{where}.method: {method.name!r} is the first stage of another method, run by the "
                              "plan (e.g. meta_kd); name that method instead")
        if method.teacher_objective:
            for teacher in self.student_teachers(student.name):
                objective = self.teachers[teacher].get("objective", "ce")
                if objective != method.teacher_objective:
                    raise KdpipeError(f"{where}: method {student.config['method']!r} distils teachers trained with "
                                      f"objective: {method.teacher_objective}; teacher {teacher!r} has objective: "
                                      f"{objective}")
        if "attentions" in method.signals:
            self.attention_feature(student.name)                       # checks attention_heads
        if method.stage == "cotrain" and student.config.get("teachers"):
            raise KdpipeError(f"{where}.teachers: method {method.name!r} trains its own teacher from "
                              "method_args.backbone; remove `teachers`")
        if student.config["model"].get("type") == "bilstm":
            if "hidden" in method.signals or method.multihead:
                raise KdpipeError(f"{where}.model: a BiLSTM student has no transformer layers or heads; method "
                                  f"{method.name!r} needs them (use a logit-level method: vanilla_kd, uhc, muki, "
                                  "dynamic_data, dynamic_teacher, prokt)")

    def _check_heads(self, student: Student, method, where: str) -> None:
        heads = student.config["model"].get("heads")
        if method.multihead and not heads:
            raise KdpipeError(f"{where}: method {method.name!r} trains a multi-head student; set model.heads, "
                              "e.g. {count: 4, layers: 1}")
        if heads and not method.multihead:
            raise KdpipeError(f"{where}.model.heads: method {method.name!r} trains a single-head student")
        members = len(self.student_teachers(student.name))
        if heads and int(heads.get("count", 0)) > members:
            raise KdpipeError(f"{where}.model.heads.count: {heads.get('count')} heads for {members} teachers; "
                              "Hydra needs at most one head per ensemble member (M <= N)")

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
        """The teachers a student learns from; an ensemble's name stands for all its members."""
        config = self.students[student].config
        if get_method(config.get("method", "")).stage == "cotrain":
            return []
        named = config.get("teachers") or list(self.teachers)
        return [member for name in named for member in self.ensembles.get(name, [name])]

    def models(self) -> list[str]:
        """Everything evaluated: teachers, ensembles (their members' mean prediction) and students (not the first
        stage of a two-stage student: it trains no classifier)."""
        students = [name for name in self.students if name not in self.first_stages]
        return [*self.teachers, *self.ensembles, *students, *self.cotrained]

    def stage_students(self, stage: str) -> list[str]:
        """The students trained by rule ``stage`` (``distill`` or ``cotrain``)."""
        return [name for name, s in self.students.items() if get_method(s.config["method"]).stage == stage]

    def teacher_layers(self, teacher: str) -> int:
        """Transformer layers of a teacher: its ``layers`` subset, else the backbone's."""
        spec = self.teachers[teacher]
        return len(spec["layers"]) if spec.get("layers") else num_layers(spec["backbone"])

    def model_dir(self, model: str) -> str:
        if model in self.teachers:
            return TEACHER.format(teacher=model)
        if model in self.cotrained:
            return COTRAINED.format(student=self.cotrained[model])
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
            if "attentions" in method.signals:
                feature = self.attention_feature(student)
                files += [f"{root}/{feature}.npy", f"{root}/{feature}.json"]
            if "domain" in method.signals:
                files += [f"{root}/domain.npy", f"{root}/domain.parquet", f"{root}/domain.json"]
        return files

    def prototype_files(self, student: str) -> list[str]:
        """Meta-KD's prototype scores, for a student whose method reads them."""
        return _prototype_files() if get_method(self.students[student].config["method"]).prototypes else []

    def init_dirs(self, student: str) -> list[str]:
        """The first stage's output, which the second stage of a two-stage student starts from."""
        return [STUDENT.format(student=first) for first, second in self.first_stages.items() if second == student]

    def teacher_prototype_files(self, teacher: str) -> list[str]:
        """The prototype scores a meta-teacher weights its examples by (none for a plain teacher)."""
        spec = self.teachers[teacher]
        weighted = (spec.get("objective_args") or {}).get("sample_weights", True)
        return _prototype_files() if spec.get("objective", "ce") == "meta" and weighted else []

    def teacher_modules(self, teacher: str) -> list[str]:
        """The kdpipe modules of a teacher's objective (imported by name, so fingerprinted here)."""
        module = TEACHER_OBJECTIVES.get(self.teachers[teacher].get("objective", "ce"))
        return [module] if module else []

    def attention_feature(self, student: str) -> str:
        """The attention dump a student reads: ``attentions`` (every head) when it has the teacher's head count,
        ``attentions_mean`` (averaged over heads) otherwise, or as ``method_args.attention_heads`` says."""
        config = self.students[student].config
        mode = (config.get("method_args") or {}).get("attention_heads", "auto")
        where = f"students.{self.students[student].entry}.method_args.stage1.attention_heads"
        if mode not in ("auto", "per_head", "mean"):
            raise KdpipeError(f"{where}: {mode!r}; choose auto, per_head or mean")
        mine = student_heads(config["model"])
        theirs = {num_heads(self.teachers[t]["backbone"]) for t in self.student_teachers(student)}
        if mode == "per_head" and theirs != {mine}:
            raise KdpipeError(f"{where}: per_head, but the student has {mine} heads and its teachers "
                              f"{sorted(theirs)}; use mean or auto")
        return "attentions" if mode == "per_head" or (mode == "auto" and theirs == {mine}) else "attentions_mean"

    def alignment(self, student: str) -> dict[str, list[list[int]]] | None:
        """For methods reading teacher hidden states: per teacher, the (student, teacher) hidden-state index pairs.

        ``strided`` (DFA, METHODS.md §1): ``method_args.align_number`` pairs from the last layer backwards;
        ``uniform`` (Dynamic KD, §2c): student state l with teacher state l·k for l = 0..L_s, embeddings included.
        """
        config = self.students[student].config
        method = get_method(config["method"])
        if "hidden" not in method.signals:
            return None
        n_student = student_layers(config["model"])
        if method.alignment == "uniform":
            return {t: [list(pair) for pair in uniform_alignment(self.teacher_layers(t), n_student)]
                    for t in self.student_teachers(student)}
        count = (config.get("method_args") or {}).get("align_number", -1)
        return {t: [list(pair) for pair in strided_alignment(self.teacher_layers(t), n_student, count)]
                for t in self.student_teachers(student)}

    def feature_layers(self, teacher: str, feature: str = "hidden") -> list[int]:
        """The layers of ``teacher`` any student needs in a feature dump (which keeps only these): hidden-state
        indices (0 = embeddings), or for attentions the 1-based layers paired with student layers 1..L_s."""
        layers = set()
        for name in self.students:
            if feature != "hidden" and (not self._reads(name, "attentions") or self.attention_feature(name) != feature):
                continue
            for t, pairs in (self.alignment(name) or {}).items():
                if t == teacher:
                    layers.update(tl for s, tl in pairs if feature == "hidden" or s >= 1)
        return sorted(layers)

    def _reads(self, student: str, signal: str) -> bool:
        return signal in get_method(self.students[student].config["method"]).signals

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
        # Keys at the default they had before they existed (``layers: null``, ``objective: ce``...) are left out, so
        # teachers configured before keep their slice (and their cached artifacts).
        return {k: v for k, v in self.teachers[teacher].items() if not (k in LATER_KEYS and v == LATER_KEYS[k])}

    def prototype_params(self) -> dict:
        return dict(self.config["prototypes"])

    def shards(self, section: str) -> int:
        """S, the shards a signal pass runs as (``mc_dropout`` or ``dump``); not part of any slice: the gathered
        artifacts are the same bytes for any S."""
        return int(self.config[section].get("shards", 1))

    def mc_params(self, split: str) -> dict:
        return {**_without(self.config["mc_dropout"], "splits", "shards"), "split": split}

    def dump_params(self, split: str) -> dict:
        return {**_without(self.config["dump"], "shards"), "split": split}

    def student_params(self, student: str) -> dict:
        params = {**self.students[student].config, "teachers": self.student_teachers(student)}
        alignment = self.alignment(student)
        if alignment:
            params["alignment"] = alignment
        if self._reads(student, "attentions"):
            params["attention_feature"] = self.attention_feature(student)
        return params

    def domain_params(self, split: str) -> dict:
        return {**self.dump_params(split), "feature": "domain"}

    def feature_params(self, teacher: str, split: str, feature: str) -> dict:
        return {**self.dump_params(split), "feature": feature, "layers": self.feature_layers(teacher, feature)}

    def eval_params(self, model: str, split: str) -> dict:
        student = self.students.get(model)
        if model in self.cotrained:
            student = self.students[self.cotrained[model]]
            return {"model": model, "base": f"{student.base}.teacher", "kind": "teacher", "method": "prokt",
                    "seed": student.seed, "split": split, **_without(self.config["evaluate"], "splits")}
        if model in self.ensembles:
            return {"model": model, "base": model, "kind": "ensemble", "method": None, "seed": None,
                    "members": self.ensembles[model], "split": split, **_without(self.config["evaluate"], "splits")}
        domain = (student.config if student else self.teachers[model]).get("domain")
        group = {"group": student.entry} if student and student.base != student.entry else {}
        return {"model": model, "base": student.base if student else model, **group,
                "kind": "student" if student else "teacher",
                "method": student.config["method"] if student else None,
                "seed": student.seed if student else self.teachers[model].get("seed"),
                "split": split, **_without(self.config["evaluate"], "splits"),
                **({"domain": domain} if domain else {})}


# Teacher keys added after the first teachers were cached, with the value that means "as before".
LATER_KEYS = {"layers": None, "objective": "ce", "objective_args": {}, "domain": None}
# Training settings that a first stage may set apart from the student's own (``method_args.stage1``).
STAGE_SETTINGS = ("epochs", "lr", "batch_size", "warmup_ratio", "weight_decay", "max_grad_norm", "checkpoint_every")


def _prototype_files() -> list[str]:
    return [PROTOTYPES]


def _split_stages(student: Student, first_stage: str) -> tuple[Student, Student]:
    """A two-stage student as two jobs: ``<name>.stage1`` (method ``first_stage``, with the training settings and
    method_args of ``method_args.stage1``) and ``<name>``, which starts from the first stage's weights and keeps the
    other method_args (so a change to the second stage reruns only it)."""
    args = dict(student.config.get("method_args") or {})
    stage1 = dict(args.pop("stage1", None) or {})
    settings = {k: stage1.pop(k) for k in STAGE_SETTINGS if k in stage1}
    first_name = f"{student.name}.stage1"
    first = Student(first_name, student.base, student.seed,
                    {**student.config, **settings, "method": first_stage, "method_args": stage1}, student.entry)
    second = Student(student.name, student.base, student.seed,
                     {**student.config, "method_args": args,
                      "model": {"init": {"from": STUDENT.format(student=first_name)}}}, student.entry)
    return first, second


def _validate(entry: dict, schema: dict, where: str) -> None:
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(entry), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        key = ".".join([where, *map(str, err.path)])
        raise KdpipeError(f"{key}: {err.message}")


def _ensemble_seeds(spec: dict, where: str) -> list[int]:
    """The member seeds of ``ensemble: {size: N}`` (seeds 0..N-1) or ``{seeds: [...]}``."""
    seeds = spec.get("seeds")
    if seeds is None:
        seeds = list(range(int(spec.get("size") or 0)))
    if spec.get("size") is not None and int(spec["size"]) != len(seeds):
        raise KdpipeError(f"{where}: size {spec['size']} but {len(seeds)} seeds {seeds}")
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise KdpipeError(f"{where}: an ensemble needs at least 2 distinct seeds, got {seeds}")
    return [int(s) for s in seeds]


def _without(mapping: dict, *keys: str) -> dict:
    """A copy without ``keys``: settings that choose *which* jobs run must not be part of each job's slice."""
    return {k: v for k, v in mapping.items() if k not in keys}
