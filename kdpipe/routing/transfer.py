"""A route's scores of the transfer rows (kdpipe.data.transfer), routed like train rows: the ``route_transfer`` job,
beside its route (docs/routing.md, "Transfer rows"). It reads the route's manifest and refits nothing of its own:
``knn`` and ``learned`` are fitted on the validation rows alone, so fitting them again on the same rows and seed
gives the route's own router. Writes ``transfer.parquet`` (row_id, scores [K]) and ``transfer.json``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import KdpipeError, atomic_path, make_manifest, read_manifest
from kdpipe.data.dataset import TRANSFER
from kdpipe.routing.artifact import FILES, write_scores
from kdpipe.routing.inputs import DeclaredSignals, RouteInputs
from kdpipe.routing.knn import knn_scores
from kdpipe.routing.learned import learned_router
from kdpipe.routing.scoring import certainty, router_features
from kdpipe.routing.settings import RouteSettings, RoutingSettings

TRANSFER_FILES = (f"{TRANSFER}.parquet", f"{TRANSFER}.json")


def route_transfer(settings: RouteSettings, data: Path, transfer: Path, signals_root: Path, route: Path) -> dict:
    """Score the transfer rows for the route in the folder ``route`` (whose settings are ``settings``); write the
    files beside the route's and return their manifest."""
    route = Path(route)
    teachers = list(settings.teachers)
    made = read_manifest(route / FILES[-1], kind="route", teachers=teachers)
    declared = settings.signals  # the transfer rows' signals, and the validation rows' for a fitted router
    signals = DeclaredSignals(signals_root, declared)
    inputs = RouteInputs(teachers, Path(data), signals, splits=tuple(declared), transfer=Path(transfer))
    scores = transfer_scores(
        inputs, settings.router, settings.score, settings.temperature, settings.routing, made.get("calibration")
    )
    with atomic_path(route / TRANSFER_FILES[0]) as tmp:
        write_scores(tmp, inputs.row_ids[TRANSFER], scores)
    manifest = make_manifest(
        "route",
        config=settings,
        teachers=inputs.teachers,
        labels=inputs.labels,
        router=made["router"],
        weighting=made["weighting"],
        gold_labels=made.get("gold_labels"),
        temperatures=made.get("temperatures"),
        rows={TRANSFER: len(inputs.row_ids[TRANSFER])},
    )
    return write_manifest(route / TRANSFER_FILES[1], manifest, [TRANSFER_FILES[0]])


def transfer_scores(
    inputs: RouteInputs,
    router: str,
    score: str | None,
    temperature: float | None,
    routing: RoutingSettings,
    temps: dict | None,
) -> np.ndarray:
    """The chosen router's (``router``, ``score``, τ ``temperature``: 1 when it has none) scores [N, K] of the
    transfer rows; ``routing``: the settings of the knn and learned routers."""
    folds, seed = int(routing.folds), int(routing.seed)
    if router == "certainty":
        return certainty(inputs, score, TRANSFER, 1.0 if temperature is None else float(temperature), temps)
    if router == "knn":
        columns = [
            knn_scores(
                inputs.pooled[t, TRANSFER],
                inputs.pooled[t, "validation"],
                inputs.own_rows(t, "validation"),
                int(routing.neighbours),
                folds=folds,
                seed=seed,
            )[0]
            for t in inputs.teachers
        ]
        return np.stack(columns, -1)
    if router == "learned":
        return learned_router(
            router_features(inputs, "validation"),
            inputs.owners["validation"],
            router_features(inputs, TRANSFER),
            len(inputs.teachers),
            folds=folds,
            seed=seed,
        )[0]
    raise KdpipeError(
        f"route: the {router} router reads each row's gold label, which transfer rows do not have; choose the "
        "certainty, knn or learned router for a student that learns from transfer rows"
    )
