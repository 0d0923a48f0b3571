"""The one place a method is registered, importable without torch (the plan reads it when the DAG is built).

Each :class:`MethodSpec` names the module that builds the method's loss (imported by name, so only its students
carry it in their code fingerprint), the cached teacher signals it reads, how its teachers' classes must relate, and
its ``method_args`` (:class:`Arg`), which the plan checks and completes before any job runs
(docs/adding-a-method.md; the losses: docs/methods.md, section numbers below).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields

from kdpipe.core.settings import Args
from kdpipe.core.store import KdpipeError
from kdpipe.methods.dynamic_choices import DATA_STRATEGIES, DIRECTIONS, DISTANCES, OBJECTIVE_STRATEGIES, TEACHER_MODES
from kdpipe.methods.settings import MethodJob
from kdpipe.routing import ROUTERS, SCORES

TYPES = {"float": (int, float), "int": (int,), "bool": (bool,), "str": (str,), "list": (list,), "dict": (dict,)}


@dataclass(frozen=True)
class Arg:
    name: str
    type: str  # a key of TYPES
    default: object
    help: str
    choices: tuple = ()  # allowed values of a "str" argument (empty: any)

    def check(self, value, where: str) -> None:
        if value is None and self.default is None:  # an argument whose default is null may be set to null
            return
        kinds = TYPES[self.type]
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            raise KdpipeError(
                f"{where}.{self.name}: expected {self.type}{' or null' if self.default is None else ''}, "
                f"got {value!r} ({type(value).__name__})"
            )
        if self.choices and value not in self.choices:
            raise KdpipeError(f"{where}.{self.name}: {value!r}; choose one of {', '.join(map(str, self.choices))}")


@dataclass(frozen=True)
class MethodSpec:
    name: str
    module: str
    signals: tuple[str, ...]  # cached per-teacher signals on the train split (kdpipe.signals.catalog): "logits",
    # "mc", "hidden", "attentions" (all heads or their mean, as the plan decides), "domain"
    teacher_classes: str  # "disjoint" | "disjoint_or_identical" | "identical" | "any": how teachers' classes relate
    summary: str
    args: tuple[Arg, ...] = ()
    builder: str = "build"  # the function of ``module`` that makes the Objective
    alignment: str = "strided"  # for "hidden": "strided" (DFA, from the top) | "uniform" (l ↔ l·k, embeddings too)
    multihead: bool = False  # needs a multi-head student (model.heads), one head per teacher at most
    stage: str = "distill"  # the rule that trains it: "distill" (cached signals) | "cotrain" (ProKT)
    first_stage: str | None = None  # a method trained first, as its own job "<student>.stage1" (Meta-KD)
    internal: bool = False  # only the first stage of another method, never named in a config
    prototypes: bool = False  # reads Meta-KD's prototype scores of the train rows (the prototypes rule)
    teacher_objective: str | None = None  # the teachers must have been trained with this objective ("meta")
    routed: bool = False  # weighs its teachers per row from a routing artifact (the route rule; docs/routing.md)
    teachers: bool = True  # False: a baseline that learns from the gold labels alone and names no teachers
    # what it learns from a row without a gold label (a transfer row, kdpipe.data.transfer): its distillation terms
    # only, a gold-label term skipping the row (kdpipe.methods.losses.gold_cross_entropy); "": it reads none
    unlabelled: str = ""

    def job_spec(self) -> dict:
        """What the distill stage needs to know of the method (:class:`kdpipe.methods.settings.MethodJob`), passed in
        its params so that the stage imports the method's module alone, not this registry."""
        return {f.name: getattr(self, f.name) for f in fields(MethodJob)} | {"signals": list(self.signals)}


@dataclass(frozen=True)
class TeacherObjective:
    """A teacher's training objective (``teachers.<name>.objective``) other than plain cross-entropy."""

    name: str
    module: str  # builds the Objective; imported by name by the finetune_teacher stage
    args: tuple[Arg, ...] = ()


def _temperature(default: float, meaning: str = "softmax temperature T of the KD term") -> Arg:
    return Arg("temperature", "float", default, meaning)


_ATTENTION_HEADS = ("auto", "per_head", "mean")  # auto: per head when the head counts agree, else averaged


def _muki(score: str) -> tuple[Arg, ...]:
    """MUKI's arguments; ``score``: the certainty score of the default router (the MC one, or no_mc's)."""
    return (
        Arg("aggregation", "str", "soft", "pick the best-scored teacher, or weight them", choices=("hard", "soft")),
        Arg("tau_s", "float", 0.2, "temperature of the soft aggregation over certainty (and knn) scores"),
        _temperature(1.0),
        Arg("margin", "bool", True, "weight each example by the margin between its two best teacher scores"),
        Arg("router", "str", "certainty", "how each row's teacher weights are made (docs/routing.md)", choices=ROUTERS),
        Arg("score", "str", score, "the certainty router's score", choices=tuple(SCORES)),
        Arg("calibrate", "bool", False, "temperature-scale each teacher on its own validation rows first"),
    )


_DYNAMIC = (
    Arg("ce_weight", "float", 1.0, "weight of the gold-label cross-entropy"),
    Arg("kd_weight", "float", 1.0, "weight of the KD term"),
    Arg("distance", "str", "mse", "KD distance: logit MSE or T²·KL", choices=DISTANCES),
    _temperature(5.0, "temperature of the KL distance"),
    Arg("entropy_grad", "bool", False, "let gradients flow through the student's entropy weights"),
)


def _dynamic(name: str, classes: str, summary: str, *args: Arg, signals=("logits",), **more) -> MethodSpec:
    """A Dynamic KD method: its builder ``build_<variant>`` in kdpipe.methods.dynamic_kd, the shared arguments first."""
    builder = "build_" + name.removeprefix("dynamic_")
    return MethodSpec(name, "kdpipe.methods.dynamic_kd", signals, classes, summary, (*_DYNAMIC, *args), builder, **more)


# Why the methods whose ``unlabelled`` is empty read no transfer row
NO_UNLABELLED_ROWS = {
    "supervised": "it learns from gold labels alone",
    "meta_kd": "each row's weight comes from its gold label and domain (prototype score, domain expertise)",
    "meta_kd_stage1": "each row's weight comes from its gold label and domain (prototype score, domain expertise)",
    "prokt": "its teacher is trained with it on the gold labels",
}

METHODS = {
    spec.name: spec
    for spec in (
        MethodSpec(
            "supervised",
            "kdpipe.methods.supervised",
            (),
            "any",
            "no teacher: cross-entropy on the gold labels, the baseline every KD method must beat (docs/methods.md §0)",
            args=(Arg("label_smoothing", "float", 0.0, "label smoothing of the cross-entropy"),),
            teachers=False,
        ),
        MethodSpec(
            "vanilla_kd",
            "kdpipe.methods.vanilla_kd",
            ("logits",),
            "disjoint_or_identical",
            "MUKI's VKD baseline: T²·KL to the softmax of the concatenated teacher logits (docs/methods.md §1)",
            args=(_temperature(5.0), Arg("hard_label_weight", "float", 0.0, "weight of the gold-label CE")),
            unlabelled="the KD term; the hard-label term (hard_label_weight) skips it",
        ),
        MethodSpec(
            "uhc",
            "kdpipe.methods.uhc",
            ("logits",),
            "disjoint",
            "UHC: per-teacher KL to the student's distribution renormalised in the teacher's block (§1)",
            args=(_temperature(1.0),),
            unlabelled="the per-teacher KL terms (it reads no gold label)",
        ),
        MethodSpec(
            "dfa",
            "kdpipe.methods.dfa",
            ("logits", "hidden"),
            "disjoint",
            "DFA: VKD + feature amalgamation of aligned teacher hidden states through trained adapters (§1)",
            args=(
                _temperature(1.0),
                Arg("kd_weight", "float", 1.0, "weight of the KD term"),
                Arg("rec_weight", "float", 1.0, "weight of the adapters' reconstruction loss"),
                Arg("amal_weight", "float", 1.0, "weight of the amalgamation loss"),
                Arg("adapter_lr", "float", 1e-3, "learning rate of the adapters"),
                Arg("align_number", "int", -1, "student layers aligned from the top (-1: all)"),
            ),
            unlabelled="the KD and feature-amalgamation terms (it reads no gold label)",
        ),
        MethodSpec(
            "muki",
            "kdpipe.methods.muki",
            ("logits",),
            "disjoint",
            "MUKI: teachers weighted per example by a router (MC-dropout certainty by default), hard or soft, "
            "margin-weighted KL (§1)",
            args=_muki("entropy"),
            unlabelled="the routed KD term, with the row's teacher weights from the route, which scores it like a "
            "train row (every router but oracle, which needs the gold label)",
            routed=True,
        ),
        MethodSpec(
            "muki_no_mc",
            "kdpipe.methods.muki",
            ("logits",),
            "disjoint",
            "MUKI with certainty from one deterministic pass instead of MC-dropout (§1, no_mc)",
            args=_muki("logit_entropy"),
            unlabelled="as muki",
            routed=True,
        ),
        _dynamic(
            "dynamic_teacher",
            "identical",
            "Dynamic KD (a): CE + KD from two teachers of different capacity weighted by student entropy (§2a)",
            Arg("mode", "str", "hard", "how student entropy picks the teacher", choices=TEACHER_MODES),
            Arg("direction", "str", "uncertain_to_small", "which teacher uncertain examples go to", choices=DIRECTIONS),
            Arg("small_teacher", "str", None, "the smaller of the two teachers (required)"),
            unlabelled="the uncertainty-weighted KD term; the cross-entropy term skips it",
        ),
        _dynamic(
            "dynamic_data",
            "disjoint_or_identical",
            "Dynamic KD (b): CE on the batch + KD on the top fraction r scored by the student (§2b)",
            Arg("strategy", "str", "margin", "how the student scores examples", choices=DATA_STRATEGIES),
            Arg("ratio", "float", 0.5, "fraction r of each batch that gets the KD term"),
            unlabelled="selected by the student's uncertainty like any row; the cross-entropy term skips it",
        ),
        _dynamic(
            "dynamic_objective",
            "identical",
            "Dynamic KD (c): per-example (1−ĥ)·logit MSE + ĥ·normalised hidden-state MSE (§2c)",
            Arg("rep_weight", "float", 1.0, "weight of the hidden-state term"),
            Arg("strategy", "str", "uncertainty", "entropy split of the terms", choices=OBJECTIVE_STRATEGIES),
            signals=("logits", "hidden"),
            alignment="uniform",
            unlabelled="the weighted logit and hidden-state terms; the cross-entropy term skips it",
        ),
        MethodSpec(
            "hydra_plus",
            "kdpipe.methods.hydra",
            ("logits",),
            "identical",
            "Hydra+: multi-head student, (1−α)CE + α[(1−β)aggregate KL + β member-to-head KL] + λ·diversity (§3)",
            multihead=True,
            args=(
                Arg("alpha", "float", 0.9, "α: weight of distillation against the gold CE"),
                Arg("beta", "float", 0.5, "β: weight of member-to-head against aggregate KL"),
                Arg("temp_aggregate", "float", 1.0, "temperature of the aggregate KL"),
                Arg("temp_individual", "float", 3.0, "temperature of the member-to-head KL"),
                Arg("diversity", "float", 1e-3, "λ: weight of the head-diversity term"),
                Arg("diversity_ramp", "list", None, "[start, end] epochs over which λ rises from 0"),
            ),
            unlabelled="every head's KD term; the correctness (cross-entropy) term skips it",
        ),
        MethodSpec(
            "hydra",
            "kdpipe.methods.hydra",
            ("logits",),
            "identical",
            "Hydra: multi-head student, member-to-head KL only (α = β = 1, λ = 0) (§3)",
            builder="build_hydra",
            multihead=True,
            args=(Arg("temp_individual", "float", 3.0, "temperature of the member-to-head KL"),),
            unlabelled="every head's KD term; the correctness (cross-entropy) term skips it",
        ),
        MethodSpec(
            "meta_kd",
            "kdpipe.methods.meta_kd.student",
            ("logits",),
            "identical",
            "Meta-KD: from a meta-teacher, stage 1 (its own job, <student>.stage1) matches attentions, hidden "
            "states and the domain representation weighted per example by (1 + prototype score)·expertise, "
            "stage 2 the soft labels at T (§4)",
            first_stage="meta_kd_stage1",
            teacher_objective="meta",
            args=(
                _temperature(2.0, "temperature of the second stage's soft cross-entropy"),
                Arg(
                    "stage1",
                    "dict",
                    {},
                    "the first stage's method_args and its own training settings (epochs, lr, batch_size, ...)",
                ),
            ),
        ),
        MethodSpec(
            "meta_kd_stage1",
            "kdpipe.methods.meta_kd.student",
            ("hidden", "attentions", "domain"),
            "identical",
            "Meta-KD's first stage (§4), run by the plan for every meta_kd student",
            builder="build_stage1",
            alignment="uniform",
            internal=True,
            prototypes=True,
            teacher_objective="meta",
            args=(
                Arg("gamma", "float", 0.5, "γ: weight of the domain-representation MSE"),
                Arg("attention_heads", "str", "auto", "attentions per head, or averaged", choices=_ATTENTION_HEADS),
            ),
        ),
        MethodSpec(
            "prokt",
            "kdpipe.methods.prokt",
            (),
            "any",
            "ProKT: a teacher from the pre-trained backbone trained jointly with the student, each step moving "
            "towards it (§5); no cached signals",
            stage="cotrain",
            args=(
                Arg("backbone", "str", "builtin:minilm-l6", "the co-trained teacher's pre-trained backbone"),
                Arg("teacher_lr", "float", 3.0e-5, "lr_T, the teacher's learning rate"),
                Arg("move_back_weight", "float", 0.4, "λ: weight of the teacher's KL towards the student"),
                Arg("dual", "bool", False, "the dual-optimisation variant"),
                Arg("epsilon", "float", 1.0, "ε of the dual variant"),
                Arg("eta", "float", 1.0e-3, "η, the multiplier's step"),
                Arg("beta", "float", 1.0, "β₀, the initial multiplier"),
                Arg("teacher_warmup", "float", 0.0, "the teacher's warm-up, a fraction of the training steps"),
                Arg("teacher_weight_decay", "float", 0.0, "the teacher's AdamW weight decay"),
            ),
        ),
    )
}

# Teacher objectives of ``finetune_teacher`` besides plain cross-entropy ("ce"): the module is imported by name,
# so that only the teachers using it carry it in their code fingerprint.
META_TEACHER = TeacherObjective(
    "meta",
    "kdpipe.methods.meta_kd.teacher",
    args=(
        Arg("gamma", "float", 0.5, "γ: weight of the domain-corruption loss"),
        Arg("sample_weights", "bool", True, "weight examples by their prototype scores"),
        Arg("domain_loss", "bool", True, "train the domain branch (the domain-corruption loss)"),
        Arg("dropout", "float", 0.1, "dropout of the domain branch"),
    ),
)
TEACHER_OBJECTIVES = {META_TEACHER.name: META_TEACHER}


def get_method(name: str) -> MethodSpec:
    try:
        return METHODS[name]
    except KeyError:
        raise KdpipeError(f"unknown method {name!r}; methods are {', '.join(sorted(METHODS))}") from None


def complete_args(declared: tuple[Arg, ...], given: dict | None, where: str) -> dict:
    """``given`` checked against the declared arguments and completed with their defaults; ``where`` names the
    config key in an error."""
    given = dict(given or {})
    known = {arg.name: arg for arg in declared}
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise KdpipeError(
                f"{where}: unknown key {key!r}{hint}; this method knows {', '.join(known) or 'no method_args'}"
            )
    for key, value in given.items():
        known[key].check(value, where)
    return {arg.name: given.get(arg.name, arg.default) for arg in declared}


def method_args(method: str, given: dict | None = None, where: str | None = None) -> Args:
    """The complete ``method_args`` of ``method`` (:func:`complete_args` with its declaration), read-only and read
    by attribute, as its ``build(ctx, args)`` gets them (:class:`kdpipe.core.settings.Args`)."""
    where = where or f"method_args of {method}"
    return Args(complete_args(get_method(method).args, given, where), where)
