"""A route's scores of the transfer rows (kdpipe.data.transfer), routed like train rows: the ``route_transfer`` job,
beside its route (docs/routing.md, "Transfer rows"). ``knn`` and ``learned`` are fitted again on the same validation
rows and seed, which gives the route's own router. Writes ``transfer.parquet`` (row_id, scores [K]) and
``transfer.json``.
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import atomic_path, make_manifest, read_manifest
from kdpipe.data.dataset import TRANSFER
from kdpipe.routing.artifact import FILES, TRANSFER_FILES, write_scores
from kdpipe.routing.inputs import RouteInputs
from kdpipe.routing.scoring import certainty, knn, learned
from kdpipe.routing.settings import RouteSettings


def route_transfer(settings: RouteSettings, data: Path, transfer: Path, signals_root: Path, route: Path) -> dict:
    """Score the transfer rows for the route in the folder ``route``; write them beside it, return their manifest."""
    route = Path(route)
    teachers = list(settings.teachers)
    made = read_manifest(route / FILES[-1], kind="route", teachers=teachers)
    declared = settings.signals  # the transfer rows' signals, and the validation rows' for a fitted router
    inputs = RouteInputs(teachers, Path(data), signals_root, declared, splits=tuple(declared), transfer=Path(transfer))
    temps = made.get("calibration")
    if settings.router == "certainty":
        scores = certainty(inputs, settings.score, TRANSFER, settings.temperature, temps)
    elif settings.router == "knn":
        scores = knn(inputs, settings.routing, TRANSFER)[TRANSFER]
    else:  # learned (the plan makes no transfer route for oracle)
        scores = learned(inputs, settings.routing, TRANSFER)[0][TRANSFER]
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
