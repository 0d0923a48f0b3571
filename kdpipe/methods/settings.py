"""The typed settings of a student's job, ``distill`` or ``cotrain`` (docs/design.md, "Style": settings read once),
made by :meth:`kdpipe.plan.slices.Slices.student_params`; torch-free. Student side: a teacher job's code does not
import it (docs/caching-and-reruns.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kdpipe.core.settings import Args, Settings, from_schema
from kdpipe.models.settings import StudentModel
from kdpipe.training.settings import Training


@dataclass(frozen=True)
class MethodJob(Settings):
    """What the registry says of a student's method (``method_spec``, :meth:`kdpipe.methods.registry.MethodSpec.
    job_spec`), passed in the slice so that the ``distill`` stage imports the method's module alone."""

    module: str
    builder: str
    signals: tuple[str, ...]
    teacher_classes: str
    prototypes: bool
    routed: bool


@dataclass(frozen=True)
class StudentSettings(Settings, Training):
    """A ``distill`` or ``cotrain`` job's slice: the student entry with its complete ``method_args``, its teachers,
    what the registry says of its method, its ``model`` and training settings; ``transfer``: the share of the
    transfer rows it learns from; ``alignment`` and ``attention_feature``: for a method that reads feature dumps."""

    method: str
    method_args: Args
    method_spec: MethodJob
    teachers: tuple[str, ...]
    model: StudentModel
    domain: str | None
    max_length: int
    eval_batch_size: int
    signals: str = from_schema("student_defaults", "signals")
    transfer: float | None = None
    alignment: Mapping[str, tuple[tuple[int, ...], ...]] | None = None
    attention_feature: str | None = None
    local_content: Mapping[str, str] | None = None
