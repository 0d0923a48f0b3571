"""Routing: each row's weight for every teacher of a knowledge-integration student (docs/routing.md).

Torch-free names read by the registry and the plan when the DAG is built; the routers, their inputs, scores,
diagnostics and cached artifact are the other modules of this package, the ``route`` job :mod:`~kdpipe.routing.build`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.core.settings import Settings

# router -> what its scores are: "certainty" scores are turned into weights by softmax(s / tau_s) (MUKI), the
# others are already weights (probabilities, a percentile softmaxed likewise for knn)
ROUTERS = ("certainty", "knn", "learned", "oracle")
GOLD_LABEL_ROUTERS = ("knn", "learned", "oracle")  # routers fitted on, or reading, gold labels


def route_label_use(router: str, calibrate: bool, rows: dict[str, int]) -> dict[str, int]:
    """The gold labels a route reads to weigh its teachers, as ``{split: rows}`` (``rows``: the route's rows per
    split; docs/routing.md, "Which labels a route reads")."""
    if router == "oracle":
        return dict(rows)
    return {"validation": rows["validation"]} if router in GOLD_LABEL_ROUTERS or calibrate else {}


# settings of the config's ``routing`` section that change only what is shown (the report's warning), not a route:
# they are in no route's config slice, so changing them reruns the report only
DISPLAY_SETTINGS = ("warn_below",)
ROUTE_SPLITS = ("train", "validation")  # the splits a route scores
# the signals every route reads from each of its teachers on each split; the MC-dropout signal comes on top
ROUTE_SIGNALS = ("logits", "pooled")

# certainty score -> the signal it is computed from: the MC-dropout pass ("mc") or the eval-mode logits
SCORES = {
    "entropy": "mc",  # MUKI's u = 1 − H(p̄)/log C
    "mutual_info": "mc",  # −(H(p̄) − mean_t H(p_t)) / log C, the epistemic part
    "max_prob": "mc",  # max p̄
    "logit_entropy": "logits",  # 1 − H(softmax(z/τ))/log C, MUKI's no_mc
    "logit_max_prob": "logits",  # max softmax(z/τ)
    "energy": "logits",  # τ·log Σ_c exp(z_c/τ)
}


@dataclass(frozen=True)
class RouteSpec(Settings):
    """What a student's routing depends on: the router, and for the certainty router its score and (for a score
    computed from logits) the temperature τ; ``calibrate`` when set. Its :meth:`to_dict` is what the route's config
    slice holds of it (the keys at their defaults left out)."""

    router: str
    score: str | None = None
    temperature: float | None = None
    calibrate: bool = False

    def name(self, teachers: list[str]) -> str:
        """The folder name of the route of ``teachers`` under results/routes/: its teachers, router, score and
        settings, readable."""
        parts = [self.router, *([self.score] if self.score else [])]
        if self.temperature is not None:
            parts.append(f"T{self.temperature:g}")
        if self.calibrate:
            parts.append("calibrated")
        return f"{'+'.join(teachers)}.{'-'.join(parts)}"

    @property
    def needs_mc(self) -> bool:
        return self.router == "certainty" and SCORES[self.score] == "mc"

    def signals(self, mc_splits: list[str] | tuple[str, ...] = ()) -> dict[str, list[str]]:
        """The teacher signals a route reads on each of its splits: the logits and pooled states, and the MC-dropout
        signal where the router's score needs it or ``mc_splits`` (``mc_dropout.splits``) makes it anyway."""
        return {
            split: [*ROUTE_SIGNALS, *(["mc"] if self.needs_mc or split in mc_splits else [])] for split in ROUTE_SPLITS
        }

    def transfer_signals(self) -> dict[str, list[str]]:
        """The teacher signals the ``route_transfer`` job of a route reads, per split: the transfer rows', and the
        validation rows' for ``knn`` and ``learned``, which are fitted on them."""
        out = {"transfer": [*ROUTE_SIGNALS, *(["mc"] if self.needs_mc else [])]}
        if self.router in ("knn", "learned"):
            out = {"validation": list(ROUTE_SIGNALS), **out}
        return out


def route_spec(router: str, score: str, temperature: float, calibrate: bool) -> RouteSpec:
    """The :class:`RouteSpec` of a student's complete method_args: the score only for the certainty router, the
    temperature only for a score computed from logits."""
    certainty = router == "certainty"
    return RouteSpec(
        router,
        score if certainty else None,
        float(temperature) if certainty and SCORES[score] == "logits" else None,
        bool(calibrate),
    )
