"""Each job's config slice: exactly the part of the config its output depends on (docs/caching-and-reruns.md).

Plain JSON-able values: the job's ``params.cfg``, compared by Snakemake's params trigger and hashed by the output cache.
"""

from __future__ import annotations

from kdpipe.core.identity import local_content
from kdpipe.core.store import KdpipeError
from kdpipe.data.transfer_sources import TRANSFER_KEYS
from kdpipe.methods.registry import TEACHER_OBJECTIVES, get_method
from kdpipe.models.backbones import HEAD_INIT_DEFAULTS, architecture_modules
from kdpipe.plan.classes import TRAINING_KEYS
from kdpipe.plan.entries import without
from kdpipe.plan.paths import ORACLE
from kdpipe.signals.catalog import FEATURES, signal_spec

# Config keys whose value may name a local file or folder (dataset.source, dataset.files.<split>, a teacher's
# backbone or checkpoint, a student's model.init.from or model.config.tokenizer, a method's *_backbone argument).
PATH_KEYS = ("source", "train", "validation", "test", "transfer", "backbone", "checkpoint", "from", "tokenizer")


def named_paths(config_slice: dict, where: str = "") -> dict[str, object]:
    """``{config key: value}`` of every value under a path key (:data:`PATH_KEYS`, or ``*_backbone``) of a slice,
    found recursively, a list as ``key[i]`` per item: what :func:`kdpipe.core.identity.local_content` digests."""
    found: dict[str, object] = {}
    for key, value in config_slice.items():
        name = f"{where}.{key}" if where else str(key)
        path_key = str(key) in PATH_KEYS or str(key).endswith("_backbone")
        if isinstance(value, dict):
            found.update(named_paths(value, name))
        elif path_key and isinstance(value, list):
            found.update({f"{name}[{i}]": item for i, item in enumerate(value)})
        elif path_key:
            found[name] = value
    return found


def with_local_content(params: dict) -> dict:
    """``params`` with ``local_content``, the digest of every local file or folder it names, so that an edit in place
    reruns the job (a slice that names no local path is unchanged)."""
    content = local_content(named_paths(params))
    return {**params, "local_content": content} if content else params


def model_slice(model_spec: dict, where: str = "model") -> dict:
    """``model_spec`` as it belongs in a student's slice: ``head_init`` and ``head_noise`` only where they change the
    heads' starting point (``head_noise`` only for ``noise``): Snakemake fills the schema's defaults into
    ``student_defaults.model``, and every student taking that model would otherwise get a new slice and rerun. A
    head_init other than ``copy`` without ``heads`` is an error naming ``where``."""
    spec = {k: v for k, v in model_spec.items() if k not in HEAD_INIT_DEFAULTS}
    head_init = model_spec.get("head_init", HEAD_INIT_DEFAULTS["head_init"])
    if head_init == HEAD_INIT_DEFAULTS["head_init"]:
        return spec
    if not model_spec.get("heads"):
        raise KdpipeError(f"{where}.head_init: {head_init!r} starts the heads of a multi-head student; set model.heads")
    spec["head_init"] = head_init
    if head_init == "noise":
        spec["head_noise"] = model_spec.get("head_noise", HEAD_INIT_DEFAULTS["head_noise"])
    return spec


class Slices:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def prepare_params(self) -> dict:
        """The dataset section; keys added later are left out at their "as before" value, so a prepared dataset
        made before them stays valid."""
        later = {"conflicts": "drop", "id_column": None, "normalize_labels": False}
        dataset = {
            k: v
            for k, v in self.config["dataset"].items()
            if not (k in later and v == later[k]) and k not in TRANSFER_KEYS
        }
        if not dataset.get("split", {}).get("unlabelled", 1):
            dataset["split"] = without(dataset["split"], "unlabelled")
        if self.ood_classes():  # held out of every split before any teacher trains (docs/methods.md)
            dataset["ood_classes"] = sorted(self.ood_classes())  # (their order changes nothing)
        return with_local_content(dataset)

    def transfer_params(self) -> dict:
        """The transfer job's slice: what the transfer rows are read from and how, and the smallest ``max_length``
        of any teacher or student (how much of a text makes it a copy of an evaluation text: kdpipe.data.transfer)."""
        dataset = self.config["dataset"]
        keys = (*TRANSFER_KEYS, "name", "text_column", "text_pair_column", "format", "encoding")
        params = {key: dataset[key] for key in keys if key in dataset}
        params["split"] = {"seed": dataset.get("split", {}).get("seed", 13)}
        models = [*self.teachers.values(), *(student.config for student in self.students.values())]
        params["max_length"] = min(int(model.get("max_length", 128)) for model in models)
        return with_local_content(params)

    def teacher_params(self, teacher: str) -> dict:
        """The teacher's settings (but ``prompt``, which only a prompted teacher has), plus the module of its objective
        when it is not plain cross-entropy."""
        spec = self.teachers[teacher]
        params = without(spec, "devices", "prompt")
        if spec.get("checkpoint"):  # the checkpoint replaces the backbone; an import trains nothing
            params = without(params, *(TRAINING_KEYS if self.imported(teacher) else ("backbone",)))
        objective = TEACHER_OBJECTIVES.get(spec.get("objective", "ce"))
        if objective:
            params["objective_module"] = objective.module
        return with_local_content(params)

    def prototype_params(self) -> dict:
        return with_local_content(dict(self.config["prototypes"]))

    def shards(self, section: str) -> int:
        """S, the shard jobs a signal pass runs as (config section ``mc_dropout`` or ``dump``); not part of any slice:
        the gathered artifacts are the same bytes for any S."""
        return int(self.config[section].get("shards", 1))

    def devices(self, model: str) -> int:
        """The processes (one per device) a teacher's, student's or co-trained teacher's training job runs as; not
        part of any slice: it changes how a job runs, not what it makes (docs/cluster.md)."""
        if model in self.teachers:
            return int(self.teachers[model].get("devices", 1))
        student = self.students[self.cotrained.get(model, model)]
        return int(student.config.get("devices", 1))

    def signal_params(self, teacher: str, split: str, signal: str) -> dict:
        """The slice of one teacher signal on one split: its pass's settings but the shard count and the disk budget
        (which change nothing it makes), plus for a feature dump the layers the students need."""
        section = signal_spec(signal).shards
        params = {**without(self.config[section], "splits", "shards", "max_gb"), "signal": signal, "split": split}
        if params.get("dropout", 0) is None:  # the default, left out so that slices made before the key stay valid
            del params["dropout"]
        if signal in FEATURES:
            params["layers"] = self.feature_layers(teacher, signal)
        return params

    def student_params(self, student: str) -> dict:
        """The student's settings with its complete method_args, its teachers, its method's registry entry (so the
        distill stage need not import the registry) and the layer alignment a feature method needs."""
        method = get_method(self.students[student].config["method"])
        params = {
            **without(self.students[student].config, "devices"),
            "teachers": self.student_teachers(student),
            "method_spec": method.job_spec(),
        }
        params["model"] = model_slice(params["model"], f"students.{self.students[student].entry}.model")
        if not self.online(student):  # the default (cached), left out so that slices made before the key stay valid
            params.pop("signals", None)
        params.pop("transfer", None)
        if self.student_transfer(student):  # only then, so that slices made before the key stay valid
            params["transfer"] = self.student_transfer(student)
        alignment = self.alignment(student)
        if alignment:
            params["alignment"] = alignment
        if self._reads(student, "attentions"):
            params["attention_feature"] = self.attention_feature(student)
        return with_local_content(params)

    def eval_params(self, model: str, splits: list[str] | None = None) -> dict:
        """The slice of a model's one evaluation job: every split it is evaluated on (``evaluate.splits`` unless
        ``splits`` names others), so adding a split reruns the job (docs/caching-and-reruns.md, "Rerun rules")."""
        splits = list(self.eval_splits() if splits is None else splits)
        if model in self.exported():  # a student's exported graph: evaluated as a student of its own
            student, precision = self.exported()[model]
            params = self.eval_params(student, splits)
            return {**params, "model": model, "base": f"{params['base']}.{precision}", "exported": precision}
        student = self.students.get(model)
        oracle = model == ORACLE and self.oracle
        if model in self.cotrained:
            student = self.students[self.cotrained[model]]
            info = {"base": f"{student.base}.teacher", "kind": "teacher", "method": "prokt", "seed": student.seed}
        elif oracle or model in self.ensembles:  # made from its members' predictions
            info = {"base": model, **({"kind": "oracle", "combine": "oracle"} if oracle else {"kind": "ensemble"})}
            info |= {"method": None, "seed": None, "members": self.oracle if oracle else self.ensembles[model]}
        elif not student and self.prompted(model):  # evaluated from its passes: the seed of its few-shot draws
            info = {"base": model, "kind": "teacher", "method": None, "seed": self.prompt_settings(model)["seed"]}
        else:
            domain = (student.config if student else self.teachers[model]).get("domain")
            info = {
                "base": student.base if student else model,
                **({"group": student.entry} if student and student.base != student.entry else {}),
                "kind": "student" if student else "teacher",
                "method": student.config["method"] if student else None,
                "seed": student.seed if student else self.teachers[model].get("seed"),
                **({"domain": domain} if domain else {}),
            }
        return {"model": model, **info, "splits": splits, **self._eval_settings(model)}

    def _eval_settings(self, model: str) -> dict:
        """The ``evaluate`` keys an evaluation job of ``model`` uses; ``ood`` and ``mc_samples`` only when set (so
        slices made before those keys stay valid), and
        ``mc_samples`` only for a model that runs inference (not one made from others' predictions or passes)."""
        settings = without(self.config["evaluate"], "splits", "oracle", "ood", "mc_samples")
        if self.has_ood():
            settings["ood"] = {key: value for key, value in self.ood_spec().items() if value is not None}
        combined = model in self.ensembles or (model == ORACLE and self.oracle)
        combined = combined or (model in self.teachers and self.prompted(model))  # (no inference of its own)
        if self.config["evaluate"].get("mc_samples") and not combined:
            settings["mc_samples"] = self.config["evaluate"]["mc_samples"]
            settings["mc_seed"] = self.config["mc_dropout"].get("seed", 0)
        return settings

    # ---- the kdpipe modules a job imports by name, added to its code fingerprint (docs/caching-and-reruns.md)
    def teacher_modules(self, teacher: str) -> list[str]:
        """The module of a teacher's objective, when it has one besides cross-entropy."""
        objective = TEACHER_OBJECTIVES.get(self.teachers[teacher].get("objective", "ce"))
        return [objective.module] if objective else []

    def signal_modules(self, signal: str) -> list[str]:
        """The pass that computes a signal."""
        return [signal_spec(signal).module]

    def student_modules(self, student: str) -> list[str]:
        """A student's method module, its architecture's (BiLSTM, multi-head) modules and, with ``signals: online``,
        the module that runs its teachers."""
        config = self.students[student].config
        online = ["kdpipe.signals.online"] if self.online(student) else []  # imported by name (signals: online)
        return [get_method(config["method"]).module, *architecture_modules(self.student_model(student)), *online]

    def model_modules(self, model: str) -> list[str]:
        """What loading a trained model imports by name: a student's architecture modules (none for a teacher)."""
        if model in self.exported():  # the ONNX loader, and the comparison with the student (imported by name)
            return ["kdpipe.models.onnx_model", "kdpipe.evaluation.exported"]
        student = self.students.get(model)
        return architecture_modules(self.student_model(model)) if student else []
