"""Routing: each row's weight for every teacher of a knowledge-integration student (docs/routing.md).

Torch-free names read by the registry and the plan when the DAG is built; the routers themselves are in
:mod:`~kdpipe.routing.certainty`, :mod:`~kdpipe.routing.knn` and :mod:`~kdpipe.routing.learned`, the cached
artifact in :mod:`~kdpipe.routing.artifact`, the routing accuracy in :mod:`~kdpipe.routing.diagnostics`, the
``route`` stage (which also routes by the gold label, the oracle) in :mod:`kdpipe.stages.route`.
"""

from __future__ import annotations

# router -> what its scores are: "certainty" scores are turned into weights by softmax(s / tau_s) (MUKI), the
# others are already weights (probabilities, a percentile softmaxed likewise for knn)
ROUTERS = ("certainty", "knn", "learned", "oracle")
GOLD_LABEL_ROUTERS = ("learned", "oracle")  # routers fitted on, or reading, gold labels

# certainty score -> the signal it is computed from: the MC-dropout pass ("mc") or the eval-mode logits
SCORES = {
    "entropy": "mc",  # MUKI's u = 1 − H(p̄)/log C
    "mutual_info": "mc",  # −(H(p̄) − mean_t H(p_t)) / log C, the epistemic part
    "max_prob": "mc",  # max p̄
    "logit_entropy": "logits",  # 1 − H(softmax(z/τ))/log C, MUKI's no_mc
    "logit_max_prob": "logits",  # max softmax(z/τ)
    "energy": "logits",  # τ·log Σ_c exp(z_c/τ)
}


def route_spec(method_args: dict) -> dict:
    """What a student's routing depends on, from its complete method_args: the router, and for the certainty
    router its score and (for a score computed from logits) the temperature τ; ``calibrate`` when set."""
    router = method_args["router"]
    spec = {"router": router}
    if router == "certainty":
        spec["score"] = method_args["score"]
        if SCORES[spec["score"]] == "logits":
            spec["temperature"] = float(method_args["temperature"])
    if method_args.get("calibrate"):
        spec["calibrate"] = True
    return spec


def route_name(teachers: list[str], spec: dict) -> str:
    """The folder name of a route under results/routes/: its teachers, router, score and settings, readable."""
    parts = [spec["router"]]
    if "score" in spec:
        parts.append(spec["score"])
    if "temperature" in spec:
        parts.append(f"T{spec['temperature']:g}")
    if spec.get("calibrate"):
        parts.append("calibrated")
    return f"{'+'.join(teachers)}.{'-'.join(parts)}"


def needs_mc(spec: dict) -> bool:
    return spec["router"] == "certainty" and SCORES[spec["score"]] == "mc"
