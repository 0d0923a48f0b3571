"""The typed settings of the teacher stages (docs/design.md, "Style": settings read once): a teacher's slice
(``finetune-teacher``, ``import-teacher``), made by :meth:`kdpipe.plan.slices.Slices.teacher_params`, and the
training loop's own :class:`TrainSettings`, which a student's settings (:mod:`kdpipe.methods.settings`) give too.
Torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from kdpipe.core.settings import Args, Settings, from_schema
from kdpipe.data.settings import ClassSlice


@dataclass
class TrainSettings:
    """The training loop's settings (:func:`kdpipe.training.loop.fit`); a setting left out gets the schema's
    default (``student_defaults``', which ``teacher_defaults`` shares)."""

    epochs: int
    lr: float
    batch_size: int = from_schema("student_defaults", "batch_size")
    warmup_ratio: float = from_schema("student_defaults", "warmup_ratio")
    weight_decay: float = from_schema("student_defaults", "weight_decay")
    max_grad_norm: float = from_schema("student_defaults", "max_grad_norm")
    seed: int = from_schema("student_defaults", "seed")
    checkpoint_every: int = from_schema("student_defaults", "checkpoint_every")
    log_every: int = 10  # steps between training-log lines (not a config key)


@dataclass(frozen=True)
class Training:
    """The training keys of a teacher's or a student's slice, as the loop's :class:`TrainSettings`."""

    epochs: int
    lr: float
    batch_size: int
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    checkpoint_every: int

    def train_settings(self) -> TrainSettings:
        return TrainSettings(**{f.name: getattr(self, f.name) for f in fields(Training)})


@dataclass(frozen=True)
class ImportedTeacherSettings(Settings):
    """An ``import-teacher`` job's slice: a fine-tuned checkpoint used as it is (no training key)."""

    checkpoint: str
    finetune: bool
    classes: tuple[str, ...] | ClassSlice | None
    max_length: int
    eval_batch_size: int
    label_map: Mapping[str, str] | None = from_schema("teacher_defaults", "label_map")
    local_content: Mapping[str, str] | None = None


@dataclass(frozen=True)
class TeacherSettings(Settings, Training):
    """A ``finetune-teacher`` job's slice: the teacher entry (``backbone``, or a ``checkpoint`` trained further),
    its classes, training settings and objective (``objective_module``: its module, imported by name)."""

    classes: tuple[str, ...] | ClassSlice | None
    max_length: int
    eval_batch_size: int
    backbone: str | None = None
    checkpoint: str | None = from_schema("teacher_defaults", "checkpoint")
    finetune: bool = from_schema("teacher_defaults", "finetune")
    label_map: Mapping[str, str] | None = from_schema("teacher_defaults", "label_map")
    layers: tuple[int, ...] | None = from_schema("teacher_defaults", "layers")
    domain: str | None = from_schema("teacher_defaults", "domain")
    objective: str = from_schema("teacher_defaults", "objective")
    objective_args: Args = field(default_factory=lambda: Args({}, "objective_args"))
    objective_module: str | None = None
    local_content: Mapping[str, str] | None = None

    @property
    def model(self) -> str:
        """What the teacher trains from: its checkpoint, else its backbone."""
        return self.checkpoint or self.backbone
