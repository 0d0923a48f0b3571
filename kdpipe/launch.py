"""Which kdpipe a job runs: the one in the workflow's own folder, whose code its fingerprint was computed from
(docs/design.md, "Which kdpipe a job runs").

The workflow imports kdpipe from the Snakefile's checkout to plan and fingerprint the jobs, and sets
:func:`job_environment` for every job and the warm server: that checkout first on ``PYTHONPATH``, the working
directory left off ``sys.path`` (``PYTHONSAFEPATH``), and where the fingerprinted package is. A job whose imported
kdpipe is elsewhere all the same (another checkout in its working directory, an install that wins) stops
(:func:`check_package`) with one line naming both places.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_ENV = "KDPIPE_PACKAGE"  # the kdpipe package folder the workflow fingerprinted
PACKAGE = Path(__file__).resolve().parent


def job_environment(env: dict | None = None, package: Path = PACKAGE) -> dict[str, str]:
    """The variables that make ``python -m kdpipe`` import ``package`` (this one): its folder's parent first on
    ``PYTHONPATH`` (once, before what ``env`` had there), no working directory on ``sys.path``, and
    :data:`PACKAGE_ENV`."""
    env = os.environ if env is None else env
    root = str(package.parent)
    rest = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry and entry != root]
    return {"PYTHONPATH": os.pathsep.join([root, *rest]), "PYTHONSAFEPATH": "1", PACKAGE_ENV: str(package)}


def check_package() -> str | None:
    """Why this process may not run a job of the workflow (one line), or None: the kdpipe it imported is not the
    one the workflow fingerprinted."""
    expected = os.environ.get(PACKAGE_ENV)
    if not expected or Path(expected).resolve() == PACKAGE:
        return None
    return (
        f"kdpipe: this job imported kdpipe from {PACKAGE}, but the workflow computed its code fingerprint from "
        f"{expected}; run the workflow's own checkout (its folder first on PYTHONPATH, no kdpipe in the working "
        "directory)"
    )
