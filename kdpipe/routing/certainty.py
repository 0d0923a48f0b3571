"""The ``certainty`` router: a score per teacher computed from that teacher's own output (docs/routing.md,
"Certainty scores"). Higher is more certain; MUKI turns the scores into weights softmax(s/τ_s) (docs/methods.md §1).

A calibrated teacher's scores are tempered as docs/routing.md, "Calibrated teachers", says. The entropy scores use
the MC pass's own :func:`kdpipe.evaluation.information.normalized_entropy`, so the same
probabilities give the cached ``certainty`` column bit for bit.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from kdpipe.evaluation.information import normalized_entropy


def logit_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """u = 1 − H(softmax(z/τ)) / log C per row, shape [N] (docs/methods.md §1.4, ``no_mc``)."""
    return _certainty(F.softmax(logits.float() / temperature, -1))


def _certainty(probs: torch.Tensor) -> torch.Tensor:
    """MUKI's u = 1 − H(p) / log C of each row of ``probs`` (docs/methods.md §1.4), float32 [N]: a one-class teacher
    has no uncertainty to normalise (log 1 = 0), so it is taken as fully certain."""
    return torch.from_numpy(1.0 - normalized_entropy(probs.numpy(force=True)))


def certainty_scores(
    score: str,
    *,
    logits: np.ndarray,
    mc_probs: np.ndarray | None = None,
    mc_table: pd.DataFrame | None = None,
    temperature: float = 1.0,
    calibration: float | None = None,
) -> torch.Tensor:
    """Score ``score`` of one teacher for every row of a split, float32 [N] (higher: more certain)."""
    cal = 1.0 if calibration is None else float(calibration)
    z = torch.tensor(np.asarray(logits), dtype=torch.float32)
    if score == "logit_entropy":
        return logit_entropy(z, temperature * cal)
    if score == "logit_max_prob":
        return F.softmax(z / (temperature * cal), -1).max(-1).values
    if score == "energy":
        t = temperature * cal
        return t * torch.logsumexp(z / t, -1)
    if mc_table is None:
        raise ValueError(f"certainty score {score!r} needs the MC-dropout signal")
    if score == "mutual_info":
        return -torch.tensor(mc_table["mutual_info"].to_numpy(), dtype=torch.float32)
    if calibration is None:  # the cached columns, exactly as the MC pass wrote them
        column = {"entropy": "certainty", "max_prob": "max_prob"}[score]
        return torch.tensor(mc_table[column].to_numpy(), dtype=torch.float32)
    # softmax(log p / T): the MC distribution's temperature changed after the fact
    probs = F.softmax(torch.log(torch.tensor(np.asarray(mc_probs), dtype=torch.float32).clamp_min(1e-12)) / cal, -1)
    if score == "max_prob":
        return probs.max(-1).values
    return _certainty(probs)
