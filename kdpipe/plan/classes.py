"""The classes each teacher covers, known when the DAG is built: a subset or a checkpoint's head, checked against the
dataset's labels and against what each student's method needs, so that a class no teacher covers or a head class
that matches nothing stops the run before any job (docs/methods.md §1;
docs/your-own-models-and-data.md, "Your own teachers")."""

from __future__ import annotations

import json
from pathlib import Path

from kdpipe.core.store import KdpipeError
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.data.settings import ClassSlice
from kdpipe.methods.registry import get_method
from kdpipe.models.heads import teacher_classes
from kdpipe.plan.budget import made_from
from kdpipe.plan.paths import DATA

# Teacher keys that only matter when a teacher is trained (left out of an imported teacher's slice)
TRAINING_KEYS = ("backbone", "epochs", "lr", "batch_size", "warmup_ratio", "weight_decay", "max_grad_norm", "seed",
                 "checkpoint_every", "layers", "objective", "objective_args", "domain")  # fmt: skip


class Classes:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def data_labels(self) -> list[str]:
        """The dataset's labels in their order: from the prepared artifact when it was made from this config (a
        rerun reads one small file), else computed from the source as the prepare stage will."""
        if self._labels is None:
            folder = Path(DATA.format(dataset=self.dataset))
            try:
                made = made_from(folder / "manifest.json", self.prepare_params())
                self._labels = json.loads((folder / "labels.json").read_text()) if made else None
            except (OSError, ValueError):
                self._labels = None
            if self._labels is None:  # read once with the split sizes the plan's disk budget needs
                self._labels = self.selected_data[1]
        return self._labels

    def imported(self, teacher: str) -> bool:
        """A teacher used as its checkpoint is, without training (``checkpoint`` with ``finetune: false``)."""
        spec = self.teachers[teacher]
        return bool(spec.get("checkpoint")) and not spec.get("finetune", True)

    def teacher_classes(self, teacher: str) -> list[str]:
        """The dataset labels a teacher predicts, in its output order."""
        if teacher not in self._classes:
            spec, labels, where = self.teachers[teacher], self.data_labels(), f"teachers.{teacher}"
            classes = spec.get("classes")
            self._classes[teacher] = teacher_classes(
                ClassSlice.from_params(classes, f"{where}.classes") if isinstance(classes, dict) else classes,
                labels,
                where,
                checkpoint=spec.get("checkpoint"),
                label_map=spec.get("label_map"),
                finetune=spec.get("finetune", True),
            )[0]
        return self._classes[teacher]

    def _check_classes(self) -> None:
        """Every teacher's classes exist in the data; every student's teachers cover its labels as its method needs."""
        for teacher, spec in self.teachers.items():
            if self.imported(teacher):
                trained = [k for k in ("layers", "domain") if spec.get(k)]
                if spec.get("objective", "ce") != "ce":
                    trained.append("objective")
                if trained:
                    raise KdpipeError(
                        f"teachers.{teacher}: {trained[0]} needs training, but finetune is false (the checkpoint is "
                        "used as it is)"
                    )
            elif spec.get("label_map") and not spec.get("checkpoint"):
                raise KdpipeError(f"teachers.{teacher}.label_map: only a teacher with a checkpoint has a head to map")
            self.teacher_classes(teacher)
        labels = self.data_labels()
        for name, student in self.students.items():
            method = get_method(student.config.get("method", ""))
            teachers = self.student_teachers(name)
            if teachers:
                teacher_blocks(
                    {t: self.teacher_classes(t) for t in teachers},
                    labels,
                    policy=method.teacher_classes,
                    where=f"students.{student.entry}",
                )
        if self.oracle:
            teacher_blocks(
                {t: self.teacher_classes(t) for t in self.oracle}, labels, policy="disjoint", where="evaluate.oracle"
            )

    def imported_teachers(self) -> list[str]:
        return [t for t in self.teachers if self.imported(t)]
