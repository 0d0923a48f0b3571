"""The typed settings of the ``route`` and ``route-transfer`` jobs (docs/design.md, "Style": settings read once),
made by :meth:`kdpipe.plan.routes.Routes.route_params`; torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kdpipe.core.settings import Settings


@dataclass(frozen=True)
class RoutingSettings(Settings):
    """The ``routing`` settings that change a route's scores (the display ones are the report's)."""

    neighbours: int
    folds: int
    seed: int


@dataclass(frozen=True)
class RouteSettings(Settings):
    """A route's slice: its teachers, its router (:class:`~kdpipe.routing.RouteSpec`'s keys), the signals it reads
    per split, and the ``routing`` settings."""

    teachers: tuple[str, ...]
    router: str
    signals: Mapping[str, tuple[str, ...]]
    routing: RoutingSettings
    score: str | None = None
    temperature: float | None = None
    calibrate: bool = False
