"""The ``route`` stage: each row's score for every teacher of a knowledge-integration student, from the cached
teacher signals, with the routing diagnostics of every router they allow (docs/routing.md).

``params`` is the route's config slice (:meth:`kdpipe.plan.routes.Routes.route_params`), whose ``signals`` names
the signals the rule declares as inputs, per split: the stage opens those under ``signals_root`` and nothing else.
The work is :func:`kdpipe.routing.build.build_route`. Teacher-side: it imports nothing of the students
(docs/caching-and-reruns.md).
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.routing.build import build_route


def run(params: dict, data: Path, signals_root: Path, out: Path) -> dict:
    """Write the route of ``params["teachers"]`` with ``params["router"]`` to the folder ``out``."""
    return build_route(params, Path(data), Path(signals_root), Path(out))
