"""The method registry, importable without torch (the workflow reads it when it builds the DAG).

To add a method: write ``kdpipe/methods/<name>.py`` with ``build(ctx, args) -> Objective`` and add one
:class:`MethodSpec` line below. Nothing else changes: the workflow asks for the declared signals, the distill
stage imports the module, and the code fingerprint of a student covers that module.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.store import KdpipeError


@dataclass(frozen=True)
class MethodSpec:
    name: str
    module: str
    signals: tuple[str, ...]   # cached per-teacher signals on the train split: "logits", "mc", "hidden",
                               # "attentions" (all heads or their mean, as the plan decides), "domain"
    teacher_classes: str       # "disjoint" | "disjoint_or_identical" | "identical" | "any": how teachers' classes relate
    summary: str
    builder: str = "build"     # the function of ``module`` that makes the Objective
    alignment: str = "strided"  # for "hidden": "strided" (DFA, from the top) | "uniform" (l ↔ l·k, embeddings too)
    multihead: bool = False     # needs a multi-head student (model.heads), one head per teacher at most
    stage: str = "distill"      # the rule that trains it: "distill" (cached signals) | "cotrain" (ProKT)
    first_stage: str | None = None   # a method trained first, as its own job "<student>.stage1" (Meta-KD)
    internal: bool = False      # only the first stage of another method, never named in a config
    prototypes: bool = False    # reads Meta-KD's prototype scores of the train rows (the prototypes rule)
    teacher_objective: str | None = None   # the teachers must have been trained with this objective ("meta")


METHODS = {spec.name: spec for spec in (
    MethodSpec("vanilla_kd", "kdpipe.methods.vanilla_kd", ("logits",), "disjoint_or_identical",
               "MUKI's VKD baseline: T²·KL to the softmax of the concatenated teacher logits (METHODS.md §1)"),
    MethodSpec("uhc", "kdpipe.methods.uhc", ("logits",), "disjoint",
               "UHC: per-teacher KL to the student's distribution renormalised in the teacher's block (§1)"),
    MethodSpec("dfa", "kdpipe.methods.dfa", ("logits", "hidden"), "disjoint",
               "DFA: VKD + feature amalgamation of aligned teacher hidden states through trained adapters (§1)"),
    MethodSpec("muki", "kdpipe.methods.muki", ("logits", "mc"), "disjoint",
               "MUKI: teachers weighted per example by MC-dropout certainty, hard or soft, margin-weighted KL (§1)"),
    MethodSpec("muki_no_mc", "kdpipe.methods.muki", ("logits",), "disjoint",
               "MUKI with certainty from one deterministic pass instead of MC-dropout (§1, no_mc)",
               builder="build_no_mc"),
    MethodSpec("dynamic_teacher", "kdpipe.methods.dynamic_kd", ("logits",), "identical",
               "Dynamic KD (a): CE + KD from two teachers of different capacity weighted by student entropy (§2a)",
               builder="build_teacher"),
    MethodSpec("dynamic_data", "kdpipe.methods.dynamic_kd", ("logits",), "disjoint_or_identical",
               "Dynamic KD (b): CE on the batch + KD on the top fraction r scored by the student (§2b)",
               builder="build_data"),
    MethodSpec("dynamic_objective", "kdpipe.methods.dynamic_kd", ("logits", "hidden"), "identical",
               "Dynamic KD (c): per-example (1−ĥ)·logit MSE + ĥ·normalised hidden-state MSE (§2c)",
               builder="build_objective", alignment="uniform"),
    MethodSpec("hydra_plus", "kdpipe.methods.hydra", ("logits",), "identical",
               "Hydra+: multi-head student, (1−α)CE + α[(1−β)aggregate KL + β member-to-head KL] + λ·diversity (§3)",
               multihead=True),
    MethodSpec("hydra", "kdpipe.methods.hydra", ("logits",), "identical",
               "Hydra: multi-head student, member-to-head KL only (α = β = 1, λ = 0) (§3)", builder="build_hydra",
               multihead=True),
    MethodSpec("meta_kd", "kdpipe.methods.meta_kd", ("logits",), "identical",
               "Meta-KD: from a meta-teacher, stage 1 (its own job, <student>.stage1) matches attentions, hidden "
               "states and the domain representation weighted per example by (1 + prototype score)·expertise, "
               "stage 2 the soft labels at T (§4)", first_stage="meta_kd_stage1", teacher_objective="meta"),
    MethodSpec("meta_kd_stage1", "kdpipe.methods.meta_kd", ("hidden", "attentions", "domain"), "identical",
               "Meta-KD's first stage (§4), run by the plan for every meta_kd student", builder="build_stage1",
               alignment="uniform", internal=True, prototypes=True, teacher_objective="meta"),
    MethodSpec("prokt", "kdpipe.methods.prokt", (), "any",
               "ProKT: a teacher from the pre-trained backbone trained jointly with the student, each step moving "
               "towards it (§5); no cached signals", stage="cotrain"),
)}


# Teacher objectives of ``finetune_teacher`` (``teachers.<name>.objective``): the module that builds each, imported
# by name so that only the teachers using it carry it in their code fingerprint. "ce" is the plain fine-tuning loss.
TEACHER_OBJECTIVES = {"ce": None, "meta": "kdpipe.meta_teacher"}


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise KdpipeError(f"unknown method {name!r}; methods are {', '.join(sorted(METHODS))}") from None
