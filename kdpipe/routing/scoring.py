"""Every router's scores on a route's inputs (docs/routing.md, "Routers"): each certainty score the declared
signals allow, ``knn``, ``learned`` and ``oracle``, and each teacher's calibration temperature when the route is
calibrated. The chosen router's scores become the route; all of them feed the diagnostics."""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

from kdpipe.core.progress import say
from kdpipe.core.store import KdpipeError
from kdpipe.routing import ROUTE_SPLITS, SCORES
from kdpipe.routing.certainty import certainty_scores
from kdpipe.routing.inputs import RouteInputs
from kdpipe.routing.knn import knn_scores
from kdpipe.routing.learned import learned_router
from kdpipe.routing.settings import RoutingSettings


def calibrate(inputs: RouteInputs) -> dict[str, dict]:
    """Each teacher's temperature, fitted on the validation rows of its own classes (docs/routing.md)."""
    out = {}
    for t in inputs.teachers:
        own = inputs.own_rows(t, "validation")
        local = np.searchsorted(np.sort(inputs.blocks[t]), inputs.gold["validation"][own])
        order = np.argsort(inputs.blocks[t])  # local class index of each block position, sorted by label index
        out[t] = fit_temperature(inputs.logits[t, "validation"][own], order[local])
    return out


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> dict:
    """Temperature scaling (Guo et al., ICML 2017): the T that minimises the NLL −log softmax(z/T)[y] of ``logits``
    [n, C] for local labels ``labels`` [n], by SciPy's bounded scalar minimiser on log T (convex enough, no gradient
    code), with the NLL before and after. No rows, or a one-class teacher, give T = 1."""
    rows = int(len(labels))
    if rows == 0 or np.asarray(logits).shape[-1] < 2:
        return {"temperature": 1.0, "rows": rows, "nll": None, "nll_calibrated": None}

    def nll(temperature: float) -> float:
        logp = log_softmax(np.asarray(logits, np.float64) / temperature, axis=-1)
        return float(-logp[np.arange(rows), labels].mean())

    bounds = (math.log(0.05), math.log(20.0))
    found = minimize_scalar(
        lambda log_t: nll(math.exp(log_t)), bounds=bounds, method="bounded", options={"xatol": 1e-4}
    )
    temperature = float(math.exp(found.x))
    return {"temperature": temperature, "rows": rows, "nll": nll(1.0), "nll_calibrated": nll(temperature)}


def certainty(inputs: RouteInputs, score: str, split: str, temperature: float | None, temps: dict | None) -> np.ndarray:
    """The certainty ``score`` of every teacher on ``split``, [N, K] (τ ``temperature``: 1 when it has none)."""
    columns = []
    for t in inputs.teachers:
        probs, table = inputs.mc.get((t, split), (None, None))
        columns.append(
            certainty_scores(
                score,
                logits=inputs.logits[t, split],
                mc_probs=probs,
                mc_table=table,
                temperature=1.0 if temperature is None else float(temperature),
                calibration=temps[t]["temperature"] if temps else None,
            ).numpy()
        )
    return np.stack(columns, -1).astype(np.float32)


def knn(inputs: RouteInputs, routing: RoutingSettings, split: str = "train") -> dict[str, np.ndarray]:
    """The knn router's scores of the rows of ``split`` and (cross-fitted) of the validation rows: each teacher's own
    validation rows are its reference (validation labels only)."""
    per_teacher = [
        knn_scores(
            inputs.pooled[t, split],
            inputs.pooled[t, "validation"],
            inputs.own_rows(t, "validation"),
            int(routing.neighbours),
            folds=int(routing.folds),
            seed=int(routing.seed),
        )
        for t in inputs.teachers
    ]
    return {s: np.stack([scores[i] for scores in per_teacher], -1) for i, s in enumerate((split, "validation"))}


def router_features(inputs: RouteInputs, split: str) -> np.ndarray:
    """The learned router's features of the rows of ``split``: every teacher's pooled states and logits."""
    return np.concatenate(
        [np.concatenate([inputs.pooled[t, split], inputs.logits[t, split]], -1) for t in inputs.teachers], -1
    )


def learned(inputs: RouteInputs, routing: RoutingSettings, split: str = "train") -> tuple[dict[str, np.ndarray], dict]:
    """The learned router's scores of the rows of ``split`` and (cross-fitted) of the validation rows, which it is
    fitted on, and the fit's figures."""
    scores, validation, figures = learned_router(
        router_features(inputs, "validation"),
        inputs.owners["validation"],
        router_features(inputs, split),
        len(inputs.teachers),
        folds=int(routing.folds),
        seed=int(routing.seed),
    )
    return {split: scores, "validation": validation}, figures


def all_routers(
    inputs: RouteInputs, router: str, temperature: float | None, routing: RoutingSettings, temps: dict | None
) -> dict[str, dict]:
    """Every router the declared signals allow: name -> {"scores": {split: [N, K]}, ...} (``router``: the chosen one,
    ``temperature``: its τ); an MC score only on the splits whose MC-dropout signal the route reads."""
    out = {}
    for score, source in SCORES.items():
        if source == "logits" or inputs.has_mc("train"):
            splits = [s for s in ROUTE_SPLITS if source == "logits" or inputs.has_mc(s)]
            out[f"certainty/{score}"] = {"scores": {s: certainty(inputs, score, s, temperature, temps) for s in splits}}
    out["knn"] = {"scores": knn(inputs, routing)}
    try:
        scores, figures = learned(inputs, routing)
        out["learned"] = {"scores": scores, "fit": figures}
    except KdpipeError as err:  # too few validation rows: an error only when it is the chosen router
        if router == "learned":
            raise
        say(f"[kdpipe] route: the learned router is left out of the diagnostics: {err}")
    eye = np.eye(len(inputs.teachers), dtype=np.float32)
    out["oracle"] = {"scores": {s: eye[inputs.owners[s]] for s in ROUTE_SPLITS}}  # each row to its class's owner
    return out
