"""One route (docs/routing.md): each train and validation row's score for every teacher of a knowledge-integration
student, from the cached teacher signals the route declared, with the diagnostics of every router they allow.

Writes the artifact of :mod:`kdpipe.routing.artifact` and says the diagnostics table and, when the chosen router
routes poorly, the warning that the report repeats (its threshold is said, not written).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.checksums import write_manifest
from kdpipe.core.progress import say
from kdpipe.core.store import atomic_path, make_manifest
from kdpipe.routing import ROUTE_SPLITS, route_label_use
from kdpipe.routing.artifact import FILES, write_scores
from kdpipe.routing.diagnostics import diagnose, ood_auroc, say_warning, text_table, warn_threshold, warning
from kdpipe.routing.inputs import RouteInputs
from kdpipe.routing.scoring import all_routers, calibrate
from kdpipe.routing.settings import RouteSettings


def build_route(
    settings: RouteSettings, data: Path, signals_root: Path, out: Path, warn_below: str | None = None
) -> dict:
    """Route the rows of train and validation for the teachers of ``settings`` with its router; write the artifact
    to the folder ``out`` and return its manifest. Warns at ``warn_below`` (``--warn-below``,
    :func:`kdpipe.routing.diagnostics.warn_threshold`)."""
    inputs = RouteInputs(list(settings.teachers), Path(data), signals_root, settings.signals)
    router, score = settings.router, settings.score
    chosen = f"certainty/{score}" if router == "certainty" else router  # its name in the diagnostics
    temps = calibrate(inputs) if settings.calibrate else None
    routers = all_routers(inputs, router, settings.temperature, settings.routing, temps)
    diagnostics = diagnose(inputs, routers)
    say(f"[kdpipe] routing of {', '.join(inputs.teachers)} (* the chosen router):\n{text_table(diagnostics, chosen)}")
    # before any student reads the route (each of its students says it again, and the report)
    say_warning(warning(diagnostics, chosen, warn_threshold(warn_below), settings.calibrate))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split in ROUTE_SPLITS:
        scores = routers[chosen]["scores"].get(split)
        if scores is None:  # an MC score without MC on validation: the split is routed but not scored
            scores = np.full((len(inputs.row_ids[split]), len(inputs.teachers)), np.nan, np.float32)
        with atomic_path(out / f"{split}.parquet") as tmp:
            write_scores(tmp, inputs.row_ids[split], scores)
    manifest = make_manifest(
        "route",
        config=settings,
        teachers=inputs.teachers,
        labels=inputs.labels,
        router=chosen,
        weighting="softmax" if router in ("certainty", "knn") else "scores",
        gold_labels=route_label_use(router, settings.calibrate, {s: len(inputs.row_ids[s]) for s in ROUTE_SPLITS}),
        temperatures={t: v["temperature"] for t, v in temps.items()} if temps else None,
        calibration=temps,
        rows={s: len(inputs.row_ids[s]) for s in ROUTE_SPLITS},
        diagnostics=diagnostics,
        ood_auroc=ood_auroc(inputs),
    )
    return write_manifest(out / FILES[-1], manifest, list(FILES[:-1]))
