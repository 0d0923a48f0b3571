"""The ``route_transfer`` stage: a route's scores of the transfer rows, routed like train rows
(kdpipe.routing.transfer; docs/routing.md, "Transfer rows")."""

from __future__ import annotations

from pathlib import Path

from kdpipe.routing.transfer import route_transfer


def run(params: dict, data: Path, transfer: Path, signals_root: Path, route: Path) -> dict:
    """Write ``transfer.parquet`` and ``transfer.json`` into the route folder ``route``."""
    return route_transfer(params, Path(data), Path(transfer), Path(signals_root), Path(route))
