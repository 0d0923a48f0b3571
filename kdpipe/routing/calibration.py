"""Temperature scaling of a teacher (Guo et al., ICML 2017; docs/routing.md, "Calibrated teachers").

One temperature T per teacher minimises the NLL of softmax(z/T) on the validation rows of its own classes (the only
rows whose label it can predict), by SciPy's bounded scalar minimiser on log T: convex enough, no gradient code.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import minimize_scalar
from scipy.special import log_softmax

BOUNDS = (math.log(0.05), math.log(20.0))


def nll(logits: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """Mean −log softmax(z/T)[y]."""
    logp = log_softmax(np.asarray(logits, np.float64) / temperature, axis=-1)
    return float(-logp[np.arange(len(labels)), labels].mean())


def fit_temperature(logits: np.ndarray, labels: np.ndarray) -> dict:
    """The NLL-minimising temperature of ``logits`` [n, C] for local labels ``labels`` [n], with the NLL before and
    after. No rows, or a one-class teacher, give T = 1."""
    if len(labels) == 0 or np.asarray(logits).shape[-1] < 2:
        return {"temperature": 1.0, "rows": int(len(labels)), "nll": None, "nll_calibrated": None}
    found = minimize_scalar(
        lambda log_t: nll(logits, labels, math.exp(log_t)), bounds=BOUNDS, method="bounded", options={"xatol": 1e-4}
    )
    temperature = float(math.exp(found.x))
    return {
        "temperature": temperature,
        "rows": int(len(labels)),
        "nll": nll(logits, labels, 1.0),
        "nll_calibrated": nll(logits, labels, temperature),
    }
