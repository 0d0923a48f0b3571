"""How well a router sends rows to the teacher that knows them (docs/routing.md, "Diagnostics").

Every router's routing and target accuracy, overall and per gold class (:func:`diagnose`), and how well each
teacher's certainty scores tell other teachers' rows from its own (:func:`ood_auroc`;
docs/routing.md, "Certainty scores as OOD detection"), both recorded in ``route.json``. The warning
(:func:`warning`) is computed from them where it is shown (the route job, each student job that reads the route:
a route linked from the shared cache runs no job; the report), at ``routing.warn_below``, a display setting in no
config slice, so changing it reruns the report only. Torch-free: the report imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kdpipe.core.progress import say
from kdpipe.routing import GOLD_LABEL_ROUTERS, ROUTE_SPLITS

WARN_BELOW = 0.8  # routing.warn_below's default (kdpipe/config.schema.yaml), for a report built by hand
WARN_ENV = "KDPIPE_WARN_BELOW"  # routing.warn_below, set by the workflow for its route and student jobs


def warn_threshold(given: str | float | None = None) -> float:
    """The routing warning's threshold: ``given`` (``--warn-below``), else the workflow's (:data:`WARN_ENV`), else
    :data:`WARN_BELOW`."""
    value = given if given is not None else os.environ.get(WARN_ENV) or None
    return WARN_BELOW if value is None else float(value)


# The scores whose AUROC as OOD detection a route records, each with the sign that orients it so that a larger
# value means a less certain teacher, so more likely a row of another teacher's class: the columns of the MC-dropout
# signal's mc.parquet (kdpipe.signals.mc_dropout.SCORES), then the eval-mode logits' max softmax (τ = 1, uncalibrated)
OOD_ORIENTATION = {
    "entropy": 1.0,  # H(p̄)/log C
    "certainty": -1.0,  # MUKI's u = 1 − H(p̄)/log C: the same AUROC as entropy's
    "max_prob": -1.0,  # max p̄
    "variance": 1.0,  # mean over classes of the variance of the T samples' probabilities
    "mean_entropy": 1.0,  # (1/T) Σ_t H(p_t)/log C, the aleatoric part
    "mutual_info": 1.0,  # H(p̄)/log C − (1/T) Σ_t H(p_t)/log C, the epistemic part
    "logit_max_prob": -1.0,  # max softmax(z) of the eval-mode logits
}
OOD_MC_SCORES = tuple(score for score in OOD_ORIENTATION if score != "logit_max_prob")


def routing_accuracy(scores: np.ndarray, owners: np.ndarray, gold: np.ndarray, labels: list[str]) -> dict:
    """{"accuracy": share routed to the owner, "per_class": {label: share}} (ties go to the first teacher)."""
    return _shares(np.asarray(scores).argmax(-1) == owners, gold, labels)


def target_accuracy(scores: np.ndarray, predictions: np.ndarray, gold: np.ndarray, labels: list[str]) -> dict:
    """As :func:`routing_accuracy` for the hard-routed target (``predictions`` [N, K]: each teacher's, as labels)."""
    routed = np.asarray(scores).argmax(-1)
    return _shares(predictions[np.arange(len(routed)), routed] == gold, gold, labels)


def _shares(right: np.ndarray, gold: np.ndarray, labels: list[str]) -> dict:
    per_class = {label: float(right[gold == c].mean()) for c, label in enumerate(labels) if (gold == c).any()}
    return {"accuracy": float(right.mean()) if len(right) else float("nan"), "per_class": per_class}


def misrouted(per_class: dict, threshold: float) -> list[str]:
    """The classes routed to their owner less often than ``threshold``, worst first."""
    return [c for c, share in sorted(per_class.items(), key=lambda kv: kv[1]) if share < threshold]


def diagnose(inputs, routers: dict) -> dict:
    """Routing and target accuracy of every router of ``routers`` (:func:`kdpipe.routing.scoring.all_routers`) on
    the splits it scored (validation cross-fitted for the learned one)."""
    out = {}
    for name, router in routers.items():
        entry = {"gold_labels": name in GOLD_LABEL_ROUTERS, **({"fit": router["fit"]} if "fit" in router else {})}
        for split, scores in router["scores"].items():
            args = (inputs.gold[split], inputs.labels)
            entry[split] = {
                "routing": routing_accuracy(scores, inputs.owners[split], *args),
                "target": target_accuracy(scores, inputs.predictions[split], *args),
            }
        out[name] = entry
    return out


def auroc(other: np.ndarray, scores: np.ndarray) -> float | None:
    """The AUROC of ``scores`` (larger: more likely a positive) for the positives ``other`` (bool [N]), ties counting
    half. None without rows on one side, or with a score that is not finite."""
    from sklearn.metrics import roc_auc_score  # here, not above: the report imports this module

    other = np.asarray(other, bool)
    scores = np.asarray(scores, np.float64)
    if other.all() or not other.any() or not np.isfinite(scores).all():
        return None
    return float(roc_auc_score(other, scores))


def teacher_ood(own: np.ndarray, logits: np.ndarray, mc_table=None) -> dict:
    """One teacher on one split: the AUROC of each score of :data:`OOD_ORIENTATION`, oriented, for the rows not of
    its classes (``own``: bool [N], its own classes' rows) against those of its classes; an MC score is None without
    the MC-dropout table ``mc_table``, every score None without rows on one side."""
    other = ~np.asarray(own, bool)
    scores = {
        name: None if mc_table is None else auroc(other, OOD_ORIENTATION[name] * mc_table[name].to_numpy())
        for name in OOD_MC_SCORES
    }
    z = np.asarray(logits, np.float64)
    max_softmax = 1.0 / np.exp(z - z.max(-1, keepdims=True)).sum(-1)  # max softmax(z) = 1 / Σ_c exp(z_c − max z)
    scores["logit_max_prob"] = auroc(other, OOD_ORIENTATION["logit_max_prob"] * max_softmax)
    return {"n_own": int((~other).sum()), "n_other": int(other.sum()), "mc": mc_table is not None, "auroc": scores}


def ood_auroc(inputs) -> dict:
    """Certainty as OOD detection on train and validation, from a route's
    :class:`~kdpipe.routing.inputs.RouteInputs`: {split: {teacher: :func:`teacher_ood`}}, the MC scores where the
    route reads the MC-dropout signal; a calibrated route's temperatures are not applied."""
    out = {}
    for split in ROUTE_SPLITS:
        out[split] = {}
        for t in inputs.teachers:
            _, table = inputs.mc.get((t, split), (None, None))
            out[split][t] = teacher_ood(inputs.own_rows(t, split), inputs.logits[t, split], table)
    return out


def text_table(diagnostics: dict, chosen: str) -> str:
    """The diagnostics as a plain-text table, the chosen router marked ``*`` (printed by the route job)."""
    lines = [f"{'router':<28}{'routing val':>12}{'routing train':>15}{'target train':>14}"]
    for name, d in diagnostics.items():

        def cell(split, what, d=d):
            return f"{d[split][what]['accuracy']:.1%}" if split in d else "—"

        mark = " *" if name == chosen else ""
        gold = " (gold labels)" if d["gold_labels"] else ""
        row = f"{name + mark:<28}{cell('validation', 'routing'):>12}{cell('train', 'routing'):>15}"
        lines.append(f"{row}{cell('train', 'target'):>14}{gold}")
    return "\n".join(lines)


def suggestion(router: str, calibrate: bool = False) -> str:
    """The method_args that choose ``router`` (its name in the diagnostics: ``certainty/<score>`` or the router),
    as a YAML mapping to paste into a student's entry (``calibrate`` when the route measured is calibrated)."""
    name, _, score = router.partition("/")
    args = [f"router: {name}"] + ([f"score: {score}"] if score else []) + (["calibrate: true"] if calibrate else [])
    return "{" + ", ".join(args) + "}"


def warning(diagnostics: dict, chosen: str, threshold: float, calibrate: bool = False) -> str | None:
    """The warning when the chosen router sends fewer than ``threshold`` of the validation rows to the teacher that
    owns their class: the misrouted classes, and a better router with the method_args that choose it. None when
    there is nothing to warn of, or the chosen router did not score the validation split."""
    mine = diagnostics[chosen].get("validation")
    if mine is None or mine["routing"]["accuracy"] >= threshold:
        return None
    classes = misrouted(mine["routing"]["per_class"], threshold)
    rivals = {
        name: d["validation"]["routing"]["accuracy"]
        for name, d in diagnostics.items()
        if name not in (chosen, "oracle") and "validation" in d
    }
    best = max(rivals, key=rivals.get) if rivals else None
    text = (
        f"router {chosen} sends {mine['routing']['accuracy']:.0%} of validation rows to the teacher that owns their "
        f"class (below routing.warn_below = {threshold:.0%}); sent to the wrong teacher: "
        + ", ".join(f"{1 - mine['routing']['per_class'][c]:.0%} of {c}" for c in classes)
    )
    if best and rivals[best] > mine["routing"]["accuracy"]:
        text += f". Router {best} routes {rivals[best]:.0%}" + (
            " (it reads the validation split's gold labels)" if diagnostics[best]["gold_labels"] else ""
        )
        text += f": method_args: {suggestion(best, calibrate)} (docs/routing.md)"
    return text


def route_warning(manifest: dict, threshold: float) -> str | None:
    """:func:`warning` of a route from its ``route.json`` (``manifest``), as the report and its students say it; None
    for a route that recorded no diagnostics of its router (one written by hand)."""
    diagnostics = manifest.get("diagnostics") or {}
    if manifest.get("router") not in diagnostics:
        return None
    return warning(diagnostics, manifest["router"], threshold, bool(manifest.get("calibration")))


def say_warning(text: str | None) -> None:
    """The routing warning's line, in the job's log and on the console (:func:`kdpipe.core.progress.say`)."""
    if text:
        say(f"[kdpipe] routing warning: {text}")


def say_route_warning(route_dir: str | Path | None, threshold: str | float | None) -> None:
    """Say the warning of the route in the folder ``route_dir`` at ``threshold`` (``--warn-below``; 0.8 when None),
    as the route job said it: a student job does before it trains. Nothing without a route."""
    if not route_dir:
        return
    from kdpipe.core.store import read_manifest

    manifest = read_manifest(Path(route_dir) / "route.json", kind="route")
    say_warning(route_warning(manifest, warn_threshold(threshold)))
