"""Which kdpipe a job runs: the workflow's own, whose code its fingerprint was computed from (docs/design.md,
"Which kdpipe a job runs"). The workflow sets :func:`job_environment` for its jobs; a job that
imported another kdpipe all the same stops (:func:`check_package`)."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ENV = "KDPIPE_PACKAGE"  # the kdpipe package folder the workflow fingerprinted
PACKAGE = Path(__file__).resolve().parent


def job_environment(env: dict | None = None, package: Path = PACKAGE) -> dict[str, str]:
    """What makes ``python -m kdpipe`` import ``package``: its folder's parent first on ``PYTHONPATH`` (then what
    ``env`` had there), no working directory on ``sys.path``, and :data:`PACKAGE_ENV`."""
    env = os.environ if env is None else env
    root = str(package.parent)
    rest = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != root]
    return {"PYTHONPATH": os.pathsep.join([root, *rest]), "PYTHONSAFEPATH": "1", PACKAGE_ENV: str(package)}


def check_package() -> str | None:
    """One line naming both places when this process imported another kdpipe than the workflow fingerprinted."""
    expected = os.environ.get(PACKAGE_ENV)
    if not expected or Path(expected).resolve() == PACKAGE:
        return None
    return (
        f"kdpipe: this job imported kdpipe from {PACKAGE}, but the workflow computed its code fingerprint from "
        f"{expected}; put the workflow's checkout first on PYTHONPATH, with PYTHONSAFEPATH=1"
    )
