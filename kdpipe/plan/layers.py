"""Which teacher layers each student aligns with, and so which layers (and attentions) a feature dump keeps."""

from __future__ import annotations

from kdpipe.core.store import KdpipeError
from kdpipe.methods.registry import get_method
from kdpipe.models.backbones import (
    hidden_size,
    model_shape,
    strided_alignment,
    student_heads,
    student_layers,
    uniform_alignment,
)


class Layers:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def teacher_model(self, teacher: str) -> str:
        """The model a teacher runs, which its layers and heads are read from: its ``checkpoint`` when it has one
        (imported or fine-tuned from it: the checkpoint replaces the backbone), else its ``backbone``."""
        spec = self.teachers[teacher]
        return spec.get("checkpoint") or spec["backbone"]

    def teacher_shape(self, teacher: str) -> tuple[int, int]:
        """(transformer layers, attention heads) of the model a teacher runs, before any ``layers`` subset; each
        model is read once per plan (a checkpoint's or local backbone's config.json)."""
        model = self.teacher_model(teacher)
        shapes = self.__dict__.setdefault("_teacher_shapes", {})
        if model not in shapes:
            shapes[model] = model_shape(model)
        return shapes[model]

    def teacher_hidden_size(self, teacher: str) -> int:
        """The hidden size of the model a teacher runs (the width of its hidden-state dump), read once per model."""
        model = self.teacher_model(teacher)
        sizes = self.__dict__.setdefault("_teacher_hidden", {})
        if model not in sizes:
            sizes[model] = hidden_size(model)
        return sizes[model]

    def teacher_layers(self, teacher: str) -> int:
        """Transformer layers of a teacher: its ``layers`` subset, else those of the model it runs."""
        spec = self.teachers[teacher]
        return len(spec["layers"]) if spec.get("layers") else self.teacher_shape(teacher)[0]

    def teacher_heads(self, teacher: str) -> int:
        """Attention heads per layer of the model a teacher runs."""
        return self.teacher_shape(teacher)[1]

    def attention_feature(self, student: str) -> str:
        """The attention dump a student reads: ``attentions`` (every head) when it has the teacher's head count,
        ``attentions_mean`` (averaged over heads) otherwise, or as ``method_args.attention_heads`` says."""
        config = self.students[student].config
        mode = (config.get("method_args") or {}).get("attention_heads", "auto")
        where = f"students.{self.students[student].entry}.method_args.stage1.attention_heads"
        if mode not in ("auto", "per_head", "mean"):
            raise KdpipeError(f"{where}: {mode!r}; choose auto, per_head or mean")
        mine = student_heads(self.student_model(student))
        theirs = {self.teacher_heads(t) for t in self.student_teachers(student)}
        if mode == "per_head" and theirs != {mine}:
            raise KdpipeError(
                f"{where}: per_head, but the student has {mine} heads and its teachers "
                f"{sorted(theirs)}; use mean or auto"
            )
        return "attentions" if mode == "per_head" or (mode == "auto" and theirs == {mine}) else "attentions_mean"

    def alignment(self, student: str) -> dict[str, list[list[int]]] | None:
        """For methods reading teacher hidden states: per teacher, the (student, teacher) hidden-state index pairs.

        ``strided`` (DFA, docs/methods.md §1): ``method_args.align_number`` pairs from the last layer backwards;
        ``uniform`` (Dynamic KD, §2c): student state l with teacher state l·k for l = 0..L_s, embeddings included.
        """
        config = self.students[student].config
        method = get_method(config["method"])
        if "hidden" not in method.signals:
            return None
        n_student = student_layers(self.student_model(student))
        count = (config.get("method_args") or {}).get("align_number", -1)

        def pairs(teacher_layers: int) -> list[tuple[int, int]]:
            if method.alignment == "uniform":
                return uniform_alignment(teacher_layers, n_student)
            return strided_alignment(teacher_layers, n_student, count)

        return {t: [list(pair) for pair in pairs(self.teacher_layers(t))] for t in self.student_teachers(student)}

    def feature_layers(self, teacher: str, feature: str = "hidden") -> list[int]:
        """The layers of ``teacher`` any student needs in a feature dump (which keeps only these): hidden-state
        indices (0 = embeddings), or for attentions the 1-based layers paired with student layers 1..L_s."""
        layers = set()
        for name in self.students:
            if self.online(name):  # it runs the teacher itself (signals: online): it reads no dump
                continue
            if feature != "hidden" and (not self._reads(name, "attentions") or self.attention_feature(name) != feature):
                continue
            for t, pairs in (self.alignment(name) or {}).items():
                if t == teacher:
                    layers.update(tl for s, tl in pairs if feature == "hidden" or s >= 1)
        return sorted(layers)
