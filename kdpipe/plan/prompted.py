"""Prompted LLM teachers in the plan (docs/methods.md §7; docs/your-own-models-and-data.md, "Prompted LLM teachers"):
a third kind of teacher beside trained and imported ones, ``teachers.<name>.prompt``.

Its model is imported once per source (the ``llm-import`` job, shared by every teacher that names it), its passes
make the ``logits``, ``mc`` and ``pooled`` signals (and the members' probabilities) on every split something reads,
sharded as the ``dump`` section says, and it is evaluated from its passes on the evaluation splits. Every check that
needs neither a tokenizer nor the weights runs here, before any job: the prompt settings
(:func:`kdpipe.signals.prompts.check_prompt_teacher`), the keys a prompted teacher cannot have, and what its
readers need of it (a method that reads token-level features of a teacher cannot read them of an LLM, whose tokens
are not the student's).
"""

from __future__ import annotations

import hashlib
import re

from kdpipe.core.store import KdpipeError
from kdpipe.methods.registry import get_method
from kdpipe.plan.paths import DATA, LLM, SIGNALS
from kdpipe.plan.slices import with_local_content
from kdpipe.signals.prompts import check_prompt_teacher

# The signals a prompted pass makes (kdpipe.signals.prompt_members.SIGNALS), and its members' probabilities' files
PROMPT_SIGNALS = ("logits", "mc", "pooled")
PROMPT_FILES = ("prompt.npy", "prompt.json")  # (kdpipe.signals.prompt_members, which imports numpy)
# Teacher keys a prompted teacher cannot have (it is never trained, and it is no checkpoint), with what they mean
NOT_PROMPTED = {
    "checkpoint": "a fine-tuned classifier checkpoint",
    "ensemble": "an ensemble of seeds (several templates, verbalizer sets or shot_draws make a prompt ensemble)",
    "layers": "a layer subset of a trained teacher",
    "domain": "training on one domain",
    "label_map": "a checkpoint's head",
}


def check_prompted_entry(spec: dict, where: str) -> None:
    """A prompted teacher's entry (``spec``: merged with teacher_defaults) sets none of the keys a trained or
    imported teacher has (:data:`NOT_PROMPTED`, a teacher objective): checked first, before the plan expands an
    ensemble or reads a checkpoint. ``where``: ``teachers.<name>``."""
    for key, what in NOT_PROMPTED.items():
        if spec.get(key):
            raise KdpipeError(
                f"{where}.{key}: a prompted teacher (prompt) is an instruction-tuned LLM used as it is, so it has no "
                f"{what}; remove one of the two"
            )
    if spec.get("objective", "ce") != "ce":
        raise KdpipeError(f"{where}.objective: a prompted teacher is never trained; remove it")


def llm_name(source: str) -> str:
    """The folder name of an imported model: the source's last path part (letters, digits, ``.``, ``_``, ``-``)
    and a digest of the whole source, so that two sources never share a folder."""
    tail = re.sub(r"[^A-Za-z0-9._-]", "_", source.rstrip("/").rsplit("/", 1)[-1]) or "model"
    return f"{tail}-{hashlib.sha256(source.encode()).hexdigest()[:8]}"


class Prompted:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    def prompted(self, teacher: str) -> bool:
        """A teacher that is a prompted LLM (``prompt`` set)."""
        return bool(self.teachers[teacher].get("prompt"))

    def prompted_teachers(self) -> list[str]:
        return [t for t in self.teachers if self.prompted(t)]

    def classifier_teachers(self) -> list[str]:
        """The teachers that are sequence classifiers: fine-tuned here or imported."""
        return [t for t in self.teachers if not self.prompted(t)]

    def inferred_models(self) -> list[str]:
        """The models the ``evaluate`` rule runs (every evaluated model but a prompted teacher, an ensemble and the
        oracle)."""
        return [*self.classifier_teachers(), *self.students, *self.cotrained, *self.exported()]

    def prompt_settings(self, teacher: str) -> dict:
        """The teacher's ``prompt`` section, checked and completed (read once per plan)."""
        done = self.__dict__.setdefault("_prompt_settings", {})
        if teacher not in done:
            done[teacher] = check_prompt_teacher(
                self.teachers[teacher]["prompt"],
                classes=self.teacher_classes(teacher),
                pairs=bool(self.config["dataset"].get("text_pair_column")),
                where=f"teachers.{teacher}.prompt",
            )
        return done[teacher]

    # ---- the import, one per model source
    def llms(self) -> dict[str, str]:
        """Every imported model's folder name -> its source."""
        sources = dict.fromkeys(self.teachers[t]["prompt"]["model"] for t in self.prompted_teachers())
        return {llm_name(source): source for source in sources}

    def llm_dir(self, teacher: str) -> str:
        """The imported model folder a prompted teacher's passes read."""
        return LLM.format(llm=llm_name(self.teachers[teacher]["prompt"]["model"]))

    def llm_params(self, llm: str) -> dict:
        """The import's slice: the source, and the digest of a local folder or file (an edit in place reimports)."""
        return with_local_content({"source": self.llms()[llm]})

    # ---- the passes
    def prompt_passes(self) -> list[tuple[str, str]]:
        """Every (prompted teacher, split) pass: where some job reads its signals (students, routes, the MC-dropout
        targets), and the evaluation splits (its evaluation reads them)."""
        out = []
        for teacher in self.prompted_teachers():
            read = [split for (t, split) in self.requested_signals if t == teacher]
            out += [(teacher, split) for split in dict.fromkeys([*read, *self.eval_splits()])]
        return out

    def prompt_params(self, teacher: str, split: str) -> dict:
        """A prompted pass's slice: the split, the rows per batch (the teacher's ``eval_batch_size``), its classes and
        its completed prompt settings. The shard count is in no slice (the same bytes for any)."""
        return {
            "split": split,
            "batch_size": int(self.teachers[teacher]["eval_batch_size"]),
            "classes": list(self.teacher_classes(teacher)),
            "prompt": self.prompt_settings(teacher),
        }

    def prompt_shots(self, split: str) -> list[str]:
        """Where a pass on ``split`` draws its few-shot examples when that is not its own artifact: the transfer rows'
        pass draws them from the prepared dataset's train split."""
        return [DATA.format(dataset=self.dataset)] if split == "transfer" else []

    def prompt_members(self, teacher: str) -> list[str]:
        """The members' probabilities of a prompted teacher's pass on each evaluation split (its evaluation's
        inputs)."""
        return [f"{SIGNALS.format(teacher=teacher, split=split)}/{PROMPT_FILES[0]}" for split in self.eval_splits()]

    def prompt_members_count(self, teacher: str) -> int:
        """The prompt ensemble's size: templates × verbalizer sets × shot draws."""
        s = self.prompt_settings(teacher)
        return len(s["templates"]) * len(s["verbalizers"]) * s["shot_draws"]

    # ---- checks, before any job
    def _check_prompted(self) -> None:
        """Every prompted teacher's keys and prompt settings, then what reads it (run once the students' method_args
        are complete)."""
        for teacher in self.prompted_teachers():
            self._check_prompted_teacher(teacher)
        prompted = set(self.prompted_teachers())
        if not prompted:
            return
        if self.has_ood():
            raise KdpipeError(
                f"evaluate.ood: the OOD evaluation runs each model on the OOD rows, which a prompted teacher "
                f"({sorted(prompted)[0]}) does not do yet; remove evaluate.ood or the prompted teacher"
            )
        served = prompted & set(self.serving_models())
        if served:
            raise KdpipeError(
                f"serving.models: {sorted(served)[0]} is a prompted teacher, which has no classifier to profile; "
                "name its students"
            )
        self._check_prompted_readers(prompted)

    def _check_prompted_teacher(self, teacher: str) -> None:
        self.prompt_settings(teacher)

    def _check_prompted_readers(self, prompted: set[str]) -> None:
        """No student's method reads a signal of a prompted teacher other than those its passes make."""
        for name, student in self.students.items():
            teachers = prompted & set(self.student_teachers(name))
            method = get_method(student.config.get("method", ""))
            token_level = [s for s in method.signals if s not in PROMPT_SIGNALS]
            if teachers and token_level:
                raise KdpipeError(
                    f"students.{student.entry}: method {method.name!r} reads the teachers' {token_level[0]} "
                    f"signal, which a prompted teacher ({sorted(teachers)[0]}) does not have: its tokens are not the "
                    "student's; distil it with a logit-level method (vanilla_kd, uhc, muki, muki_no_mc, "
                    "dynamic_teacher, dynamic_data, hydra)"
                )
