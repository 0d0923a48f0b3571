"""Out-of-distribution evaluation in the plan (``evaluate.ood``): which rows are OOD, where they are prepared, and
the checks that stop a config before any job (docs/methods.md, "Judging uncertainty")."""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.store import KdpipeError
from kdpipe.data.transfer_sources import check_text_source
from kdpipe.methods.registry import get_method
from kdpipe.models.backbones import stored_dropout
from kdpipe.models.heads import fine_tuned_classes, head_labels
from kdpipe.plan.paths import DATA, OOD_DATA
from kdpipe.plan.slices import with_local_content

OOD_SPLIT = "ood"  # the split of the OOD rows (kdpipe.data.dataset.OOD, without pandas)
OOD_SUFFIXES = (".csv", ".tsv", ".jsonl", ".parquet")


class Ood:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def ood_spec(self) -> dict:
        return self.config["evaluate"].get("ood") or {}

    def has_ood(self) -> bool:
        return bool(self.ood_spec())

    def ood_classes(self) -> list[str]:
        """The classes held out of the whole run as the OOD set (``evaluate.ood.classes``)."""
        return list(self.ood_spec().get("classes") or [])

    def ood_source(self) -> bool:
        """The OOD set is an external file (``evaluate.ood.source``), prepared by the ``ood`` job."""
        return bool(self.ood_spec().get("source"))

    def ood_dir(self) -> str:
        """The artifact holding the OOD rows: the prepared dataset (held-out classes) or the ``ood`` job's."""
        return OOD_DATA.format(dataset=self.dataset) if self.ood_source() else DATA.format(dataset=self.dataset)

    def ood_inputs(self) -> list[str]:
        """What an evaluation job reads besides the dataset: the external OOD rows, when there are any."""
        return [OOD_DATA.format(dataset=self.dataset)] if self.ood_source() else []

    def ood_params(self) -> dict:
        """The ``ood`` job's slice: the file and how to read it (the dataset's own slice is its input's)."""
        dataset, spec = self.config["dataset"], self.ood_spec()
        params = {key: dataset[key] for key in ("name", "text_pair_column", "encoding") if key in dataset}
        params["format"] = "auto"  # the OOD file's own extension says its format, whatever dataset.format says
        params["source"] = spec["source"]
        params["text_column"] = spec.get("text_column") or dataset.get("text_column", "text")
        return with_local_content(params)

    def _check_ood(self) -> None:
        """What the schema cannot say: one kind of OOD set, a test split to compare with, held-out classes that
        exist and leave every teacher two classes or more, an OOD file that exists."""
        spec = self.ood_spec()
        if not spec:
            return
        if spec.get("classes") and spec.get("source"):
            raise KdpipeError(
                "evaluate.ood: set classes (hold classes of the dataset out) or source (an external file), not both"
            )
        if not spec.get("classes") and not spec.get("source"):
            raise KdpipeError("evaluate.ood: set classes: [...] (held-out classes) or source: FILE")
        if spec.get("text_column") and not spec.get("source"):
            raise KdpipeError("evaluate.ood.text_column: only an OOD source file has a text column to name")
        if "test" not in self.eval_splits():
            raise KdpipeError(
                "evaluate.ood: OOD rows are compared with the in-distribution test rows, but evaluate.splits is "
                f"{self.config['evaluate']['splits']}; add test"
            )
        if spec.get("source"):
            self._check_ood_file(spec)
        self._check_held_out()

    def _check_ood_file(self, spec: dict) -> None:
        """The OOD file is one kdpipe reads (by its extension), with its text column and a data row."""
        path = Path(spec["source"])
        if path.is_file() and path.suffix.lower() not in OOD_SUFFIXES:
            raise KdpipeError(
                f"{path}: kdpipe reads an OOD file by its extension, one of {', '.join(OOD_SUFFIXES)} "
                "(evaluate.ood.source); rename it"
            )
        column_key = "evaluate.ood.text_column" if spec.get("text_column") else "dataset.text_column"
        params = self.ood_params()
        check_text_source(
            str(path),
            "evaluate.ood.source",
            text_column=params["text_column"],
            text_pair_column=params.get("text_pair_column"),
            fmt=params["format"],
            encoding=params["encoding"],
            column_keys={"text_column": column_key},
        )

    def _check_held_out(self) -> None:
        """No teacher trains on a held-out class (named in its classes, or known to its checkpoint), and every
        teacher keeps two classes or more."""
        held = self.ood_classes()
        if not held:
            return
        folded = {c.lower() for c in held}
        for teacher, spec in self.teachers.items():
            listed = spec.get("classes")
            named = [c for c in listed if c in held] if isinstance(listed, list) else []
            if named:
                raise KdpipeError(
                    f"teachers.{teacher}.classes: {named[0]!r} is held out as OOD by evaluate.ood.classes, so no "
                    "model may train on it; drop it from the teacher's classes"
                )
            head = head_labels(spec["checkpoint"], f"teachers.{teacher}") if spec.get("checkpoint") else []
            _refuse_known_class(f"teachers.{teacher}: its checkpoint", head, spec.get("label_map"), folded)
        for where, source in self._student_sources():
            _refuse_known_class(f"{where}: {source}", fine_tuned_classes(source) or [], None, folded)
        for teacher in self.teachers:
            classes = self.teacher_classes(teacher)
            if len(classes) < 2:
                raise KdpipeError(
                    f"teachers.{teacher}: with evaluate.ood.classes {held} held out it is left with "
                    f"{len(classes)} class ({classes}); a classifier needs two: hold out fewer classes or give "
                    "the teacher more"
                )

    def _student_sources(self) -> list[tuple[str, str]]:
        """(config key, model) of every model a student starts from: its ``model.init.from`` and, for a co-trained
        method (ProKT), its teacher's ``method_args.backbone``."""
        sources = []
        for student in self.students.values():
            where = f"students.{student.entry}"
            config = student.config
            sources.append((f"{where}.model.init.from", (config["model"].get("init") or {}).get("from")))
            if get_method(config.get("method", "")).stage == "cotrain":
                sources.append((f"{where}.method_args.backbone", (config.get("method_args") or {}).get("backbone")))
        return [(where, source) for where, source in sources if isinstance(source, str)]

    def _check_mc_samples(self) -> None:
        """``evaluate.mc_samples`` on a model whose dropout is zero everywhere would give T equal samples (a model
        whose config cannot be read without loading it is checked by its job)."""
        if not self.config["evaluate"].get("mc_samples"):
            return
        for teacher, spec in self.teachers.items():
            source = spec.get("checkpoint") or spec.get("backbone")
            if isinstance(source, str) and stored_dropout(source) == 0:
                raise _no_dropout(f"teachers.{teacher.split('.')[0]}", source)
        for name, student in self.students.items():
            if name in self.first_stages:
                continue
            model = student.config["model"]
            where = f"students.{student.entry}.model"
            if model.get("type") == "bilstm" and float(model.get("dropout", 0.4)) == 0:
                raise KdpipeError(
                    f"{where}.dropout is 0, so evaluate.mc_samples would draw T identical samples of this BiLSTM; "
                    "leave evaluate.mc_samples out, or give it dropout"
                )
            cotrained = (student.config.get("method_args") or {}).get("backbone")  # ProKT's teacher, evaluated too
            sources = [(where, (model.get("init") or {}).get("from")), (f"{where[:-6]}.method_args", cotrained)]
            for key, source in sources:
                if isinstance(source, str) and stored_dropout(source) == 0:
                    raise _no_dropout(key, source)


def _refuse_known_class(what: str, head: list[str], label_map: dict | None, folded: set[str]) -> None:
    """Stop the plan when a starting model's ``head`` (renamed by ``label_map``) predicts a class of ``folded`` (the
    held-out classes in lower case)."""
    label_map = label_map or {}
    known = [label_map.get(c, c) for c in head if label_map.get(c, c).lower() in folded]
    if known:
        raise KdpipeError(
            f"{what} already predicts {known[0]!r}, which evaluate.ood.classes holds out as unseen; hold out a class "
            "it never learnt, or start from another model"
        )


def _no_dropout(where: str, source: str) -> KdpipeError:
    return KdpipeError(
        f"{where}: {source} has no dropout (every dropout probability of its config is 0), so evaluate.mc_samples "
        "would draw T identical samples; leave evaluate.mc_samples out, or use a model with dropout"
    )
