"""The ``route`` stage: each row's score for every teacher of a knowledge-integration student, from the cached
teacher signals, with the routing diagnostics of every router they allow (docs/routing.md).

``params`` is the route's config slice (:meth:`kdpipe.plan.routes.Routes.route_params`), whose ``signals`` names
the signals the rule declares as inputs, per split: the stage opens those under ``signals_root`` and nothing else.
The work is :func:`kdpipe.routing.build.build_route`. ``--warn-below``, else the workflow's
``routing.warn_below`` (``KDPIPE_WARN_BELOW``, outside the slice: a change reruns no route), is the threshold of the
routing warning the job says as soon as the route is made, before any student reads it. Teacher-side: it imports
nothing of the students (docs/caching-and-reruns.md).
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.routing.build import build_route
from kdpipe.routing.diagnostics import warn_threshold


def run(params: dict, data: Path, signals_root: Path, out: Path, warn_below: str | None = None) -> dict:
    """Write the route of ``params["teachers"]`` with ``params["router"]`` to the folder ``out``; warn when its
    router sends fewer than ``warn_below`` of the validation rows to their class's teacher (default 0.8)."""
    return build_route(params, Path(data), Path(signals_root), Path(out), warn_threshold(warn_below))
