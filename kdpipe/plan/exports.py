"""Exported students and serving profiles in the plan (docs/your-own-models-and-data.md,
"Using the student you get"; docs/report.md, "Exported models and serving profiles").

With ``export.onnx`` or ``export.int8``, each student that ``export.students`` names has an fp32 ONNX folder
``results/exported/<student>.onnx``, and with ``export.int8`` an int8 one, ``<student>.int8``, made from it; the models
asked for are evaluated like any model, against the student they come from. ``serving.models`` names the models whose
serving profile is measured (``results/serving/<model>.json``).
"""

from __future__ import annotations

from kdpipe.core.store import KdpipeError
from kdpipe.plan.paths import EVAL, EXPORTED, STUDENT

PRECISIONS = ("onnx", "int8")


class Exports:
    def exported(self) -> dict[str, tuple[str, str]]:
        """``{model: (its student, "onnx" or "int8")}`` of every exported folder the plan makes (the fp32 export of a
        student whose int8 model alone is asked for included: it is its source)."""
        settings = self.config["export"]
        students = self._export_students(settings["students"])  # (names checked even when nothing is exported)
        if not (settings["onnx"] or settings["int8"]):
            return {}
        out = {}
        for student in students:
            out[f"{student}.onnx"] = (student, "onnx")
            if settings["int8"]:
                out[f"{student}.int8"] = (student, "int8")
        return out

    def _export_students(self, named) -> list[str]:
        trained = [s for s in self.students if s not in self.first_stages]
        if named == "all":
            return trained
        if isinstance(named, str):
            raise KdpipeError(f"export.students is {named!r}: give all, or a list of student names")
        chosen = []
        for name in named:
            found = [s for s in trained if s == name or self.students[s].entry == name]
            if not found:
                raise KdpipeError(f"export.students names {name!r}, which is no student; students are {trained}")
            chosen += [s for s in found if s not in chosen]
        return chosen

    def evaluated_exports(self) -> list[str]:
        """The exported models evaluated (and shown in the report): those ``export.onnx`` and ``export.int8`` ask
        for."""
        asked = {precision for precision in PRECISIONS if self.config["export"][precision]}
        return [model for model, (_, precision) in self.exported().items() if precision in asked]

    def export_source(self, model: str) -> str:
        """What an exported folder is made from: its student's folder (fp32), or its fp32 export (int8)."""
        student, precision = self.exported()[model]
        return STUDENT.format(student=student) if precision == "onnx" else EXPORTED.format(model=f"{student}.onnx")

    def export_params(self, model: str) -> dict:
        """The slice of an export job: the model's name and the settings that change its bytes (the accuracy margin
        for an int8 model, whose card says whether it is flagged)."""
        student, precision = self.exported()[model]
        settings = self.config["export"]
        if precision == "onnx":
            return {"model": model, "student": student, "opset": settings["opset"]}
        return {"model": model, "student": student, "max_accuracy_drop": settings["max_accuracy_drop"]}

    def export_reference(self, model: str) -> list[str]:
        """The evaluation folder of the student an exported model comes from, in a list (empty for other models)."""
        if model not in self.exported():
            return []
        return [EVAL.rsplit("/", 1)[0].format(model=self.exported()[model][0])]

    def serving_models(self) -> list[str]:
        """The models ``serving.models`` names (a name with seeds: its first seed), each checked."""
        known = [*self.teachers, *(s for s in self.students if s not in self.first_stages), *self.exported()]
        chosen = []
        for name in self.config["serving"]["models"]:
            found = [m for m in known if m == name or self._entry_of(m) == name]
            if not found:
                raise KdpipeError(f"serving.models names {name!r}, which is no model of this run; models are {known}")
            if found[0] not in chosen:
                chosen.append(found[0])
        return chosen

    def _entry_of(self, model: str) -> str | None:
        """The config entry a student or an exported model comes from, with the export's suffix (``s.seed1.int8``:
        ``s.int8``); None for a teacher."""
        if model in self.students:
            return self.students[model].entry
        if model in self.exported():
            student, precision = self.exported()[model]
            return f"{self.students[student].entry}.{precision}"
        return None

    def serving_params(self, model: str) -> dict:
        """The slice of a serving profile: the model's name and kind and the ``serving`` settings."""
        kind = "teacher" if model in self.teachers else "student"
        settings = {key: value for key, value in self.config["serving"].items() if key != "models"}
        return {"model": model, "kind": kind, **settings}
