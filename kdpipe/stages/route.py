"""The ``route`` stage: each row's score for every teacher of a knowledge-integration student, from the cached
teacher signals, with the routing diagnostics of every router the cache allows (docs/routing.md).

Reads, per teacher, the logits and pooled states of the train and validation splits (and the MC-dropout signal
where it was made), writes ``train.parquet`` / ``validation.parquet`` (row_id, scores [K]) and ``route.json``.
It prints the diagnostics table, and a warning when the chosen router sends fewer than ``warn_below`` of the
validation rows to the teacher that owns their class, naming those classes and the router that does better.
Teacher-side: it imports nothing of the students (docs/caching-and-reruns.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import KdpipeError, atomic_path, make_manifest
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.routing import GOLD_LABEL_ROUTERS, SCORES
from kdpipe.routing.artifact import FILES, SPLITS, write_scores
from kdpipe.routing.calibration import fit_temperature
from kdpipe.routing.certainty import certainty_scores
from kdpipe.routing.diagnostics import misrouted, routing_accuracy, target_accuracy
from kdpipe.routing.knn import knn_scores
from kdpipe.routing.learned import learned_router
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.io import read_logits, read_mc, read_pooled


class Inputs:
    """The data and every teacher's cached signals on the train and validation splits."""

    def __init__(self, params: dict, data: Path, signals_root: Path):
        self.teachers = list(params["teachers"])
        self.labels = read_labels(data)
        self.frames = {s: read_split(data, s) for s in SPLITS}
        self.row_ids = {s: f["row_id"].to_numpy() for s, f in self.frames.items()}
        self.gold = {s: f["label_id"].to_numpy() for s, f in self.frames.items()}
        self.logits, self.pooled, self.mc = {}, {}, {}
        classes = {}
        for t in self.teachers:
            for s in SPLITS:
                folder = Path(signals_root) / t / s
                self.logits[t, s], classes[t] = read_logits(folder / SIGNALS["logits"].files[0], self.row_ids[s])
                self.pooled[t, s], _ = read_pooled(folder / SIGNALS["pooled"].files[0], self.row_ids[s])
                mc_file = folder / SIGNALS["mc"].files[0]
                if mc_file.exists():
                    probs, table = read_mc(mc_file, self.row_ids[s], classes[t])
                    self.mc[t, s] = (np.asarray(probs), table)
        self.blocks = teacher_blocks(classes, self.labels, policy="disjoint", where="route")
        owner = np.empty(len(self.labels), np.int64)
        for k, t in enumerate(self.teachers):
            owner[self.blocks[t]] = k
        self.owners = {s: owner[g] for s, g in self.gold.items()}
        # each teacher's predicted class as a student label index, [N, K]
        self.predictions = {
            s: np.stack([self.blocks[t][self.logits[t, s].argmax(-1)] for t in self.teachers], -1) for s in SPLITS
        }

    def own_rows(self, teacher: str, split: str) -> np.ndarray:
        return np.isin(self.gold[split], self.blocks[teacher])

    def has_mc(self, split: str) -> bool:
        return all((t, split) in self.mc for t in self.teachers)


def calibrate(inputs: Inputs) -> dict[str, dict]:
    """Each teacher's temperature, fitted on the validation rows of its own classes (docs/routing.md)."""
    out = {}
    for t in inputs.teachers:
        own = inputs.own_rows(t, "validation")
        local = np.searchsorted(np.sort(inputs.blocks[t]), inputs.gold["validation"][own])
        order = np.argsort(inputs.blocks[t])  # local class index of each block position, sorted by label index
        out[t] = fit_temperature(inputs.logits[t, "validation"][own], order[local])
    return out


def certainty(inputs: Inputs, score: str, split: str, temperature: float, temps: dict | None) -> np.ndarray:
    columns = []
    for t in inputs.teachers:
        probs, table = inputs.mc.get((t, split), (None, None))
        columns.append(
            certainty_scores(
                score,
                logits=inputs.logits[t, split],
                mc_probs=probs,
                mc_table=table,
                temperature=temperature,
                calibration=temps[t]["temperature"] if temps else None,
            ).numpy()
        )
    return np.stack(columns, -1).astype(np.float32)


def knn(inputs: Inputs, neighbours: int) -> dict[str, np.ndarray]:
    per_teacher = [
        knn_scores(
            inputs.pooled[t, "train"],
            inputs.pooled[t, "validation"],
            inputs.own_rows(t, "train"),
            inputs.own_rows(t, "validation"),
            neighbours,
        )
        for t in inputs.teachers
    ]
    return {s: np.stack([scores[i] for scores in per_teacher], -1) for i, s in enumerate(SPLITS)}


def learned(inputs: Inputs, folds: int, seed: int) -> tuple[dict[str, np.ndarray], dict]:
    features = {
        s: np.concatenate([np.concatenate([inputs.pooled[t, s], inputs.logits[t, s]], -1) for t in inputs.teachers], -1)
        for s in SPLITS
    }
    train, validation, figures = learned_router(
        features["validation"],
        inputs.owners["validation"],
        features["train"],
        len(inputs.teachers),
        folds=folds,
        seed=seed,
    )
    return {"train": train, "validation": validation}, figures


def oracle(inputs: Inputs) -> dict[str, np.ndarray]:
    return {s: np.eye(len(inputs.teachers), dtype=np.float32)[inputs.owners[s]] for s in SPLITS}


def all_routers(inputs: Inputs, params: dict, temps: dict | None) -> dict[str, dict]:
    """Every router the cached signals allow: name -> {"scores": {split: [N, K]}, ...}."""
    settings = params["routing"]
    temperature = float(params.get("temperature", 1.0))
    out = {}
    for score, source in SCORES.items():
        if (
            score == "mutual_info"
            and inputs.has_mc("train")
            and "mutual_info" not in inputs.mc[inputs.teachers[0], "train"][1]
        ):
            continue  # an MC signal made before the column existed
        if source == "logits" or inputs.has_mc("train"):
            splits = [s for s in SPLITS if source == "logits" or inputs.has_mc(s)]
            out[f"certainty/{score}"] = {"scores": {s: certainty(inputs, score, s, temperature, temps) for s in splits}}
    out["knn"] = {"scores": knn(inputs, int(settings["neighbours"]))}
    try:
        scores, figures = learned(inputs, int(settings["folds"]), int(settings["seed"]))
        out["learned"] = {"scores": scores, "fit": figures}
    except KdpipeError as err:  # too few validation rows: an error only when it is the chosen router
        if params["router"] == "learned":
            raise
        print(f"[kdpipe] route: the learned router is left out of the diagnostics: {err}", file=sys.stderr)
    out["oracle"] = {"scores": oracle(inputs)}
    return out


def chosen_name(params: dict) -> str:
    return f"certainty/{params['score']}" if params["router"] == "certainty" else params["router"]


def diagnose(inputs: Inputs, routers: dict) -> dict:
    """Routing and target accuracy of every router on both splits (validation cross-fitted for the learned one)."""
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


def warning(diagnostics: dict, chosen: str, threshold: float) -> str | None:
    """The warning printed (and shown at the top of the report) when the chosen router routes fewer than
    ``threshold`` of the validation rows to their owner."""
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
            " (fitted on the validation split's gold labels)" if diagnostics[best]["gold_labels"] else ""
        )
        text += f": method_args router: {best.split('/')[0]} (docs/routing.md)"
    return text


def table(diagnostics: dict, chosen: str) -> str:
    """The diagnostics as a plain-text table (printed by the step)."""
    lines = [f"{'router':<28}{'routing val':>12}{'routing train':>15}{'target train':>14}"]
    for name, d in diagnostics.items():

        def cell(split, what, d=d):
            return f"{d[split][what]['accuracy']:.1%}" if split in d else "—"

        mark = " *" if name == chosen else ""
        gold = " (gold labels)" if d["gold_labels"] else ""
        row = f"{name + mark:<28}{cell('validation', 'routing'):>12}{cell('train', 'routing'):>15}"
        lines.append(f"{row}{cell('train', 'target'):>14}{gold}")
    return "\n".join(lines)


def run(params: dict, data: Path, signals_root: Path, out: Path) -> dict:
    """Route the rows of train and validation for ``params["teachers"]`` with ``params["router"]``; write the
    artifact to the folder ``out``."""
    inputs = Inputs(params, Path(data), Path(signals_root))
    chosen = chosen_name(params)
    if params["router"] == "certainty" and SCORES[params["score"]] == "mc" and not inputs.has_mc("train"):
        raise KdpipeError(f"route: score {params['score']!r} needs the MC-dropout signal of every teacher on train")
    temps = calibrate(inputs) if params.get("calibrate") else None
    routers = all_routers(inputs, params, temps)
    diagnostics = diagnose(inputs, routers)
    alert = warning(diagnostics, chosen, float(params["routing"]["warn_below"]))
    print(f"[kdpipe] routing of {', '.join(inputs.teachers)} (* the chosen router):\n{table(diagnostics, chosen)}")
    if alert:
        print(f"[kdpipe] WARNING: {alert}", file=sys.stderr)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        scores = routers[chosen]["scores"].get(split)
        if scores is None:  # an MC score without MC on validation: the split is routed but not scored
            scores = np.full((len(inputs.row_ids[split]), len(inputs.teachers)), np.nan, np.float32)
        with atomic_path(out / f"{split}.parquet") as tmp:
            write_scores(tmp, inputs.row_ids[split], scores)
    manifest = make_manifest(
        "route",
        config=params,
        teachers=inputs.teachers,
        labels=inputs.labels,
        router=chosen,
        weighting="softmax" if params["router"] in ("certainty", "knn") else "scores",
        gold_labels=params["router"] in GOLD_LABEL_ROUTERS,
        temperatures={t: v["temperature"] for t, v in temps.items()} if temps else None,
        calibration=temps,
        rows={s: len(inputs.row_ids[s]) for s in SPLITS},
        diagnostics=diagnostics,
        warning=alert,
    )
    return write_manifest(out / FILES[-1], manifest, list(FILES[:-1]))
