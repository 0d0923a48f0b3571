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
    signals: tuple[str, ...]   # cached per-teacher signals on the train split: "logits", "mc"
    teacher_classes: str       # "disjoint" | "disjoint_or_identical" | "any": how teachers' class subsets may relate
    summary: str
    builder: str = "build"     # the function of ``module`` that makes the Objective


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
)}


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise KdpipeError(f"unknown method {name!r}; methods are {', '.join(sorted(METHODS))}") from None
