"""Which kdpipe a job runs: the workflow's own, exactly the code its fingerprint was computed from (docs/design.md,
"Which kdpipe a job runs").

``python -m kdpipe`` reads every source file of the package once, at its start (:class:`Snapshot`), and imports
kdpipe from those bytes only, so the code a job runs is the code its fingerprint checks (``kdpipe.cli``). Standard
library only: this launcher is part of no job's fingerprint.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import time
from pathlib import Path

PACKAGE_ENV = "KDPIPE_PACKAGE"  # the kdpipe package folder the workflow fingerprinted
PACKAGE = Path(__file__).resolve().parent
# Tests hold a job at a named point of its start (docs/testing.md, "Edits while a job runs"): "POINT=FILE,..."
PAUSE_ENV = "KDPIPE_TEST_PAUSE"


def job_environment(env: dict | None = None, package: Path = PACKAGE) -> dict[str, str]:
    """What makes ``python -m kdpipe`` import ``package``: its parent first on ``PYTHONPATH``; :data:`PACKAGE_ENV`."""
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


class Snapshot(importlib.abc.MetaPathFinder):
    """The package's source files, read once: every ``kdpipe`` module imported after :meth:`install` comes from them."""

    def __init__(self, package: Path = PACKAGE):
        self.package = package
        self.sources = {path: path.read_bytes() for path in sorted(package.rglob("*.py"))}

    def install(self) -> None:
        """Serve kdpipe from the snapshot, the package itself included; this launcher stays as it was loaded."""
        sys.meta_path.insert(0, self)
        for name in [n for n in sys.modules if n.partition(".")[0] == "kdpipe" and n != __name__]:
            del sys.modules[name]
        importlib.import_module("kdpipe")

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "kdpipe" and not fullname.startswith("kdpipe."):
            return None
        parts = fullname.split(".")[1:]
        package = self.package.joinpath(*parts, "__init__.py")
        if package in self.sources:
            return importlib.util.spec_from_file_location(
                fullname, package, loader=_Loader(package, self.sources[package]), submodule_search_locations=[]
            )
        module = self.package.joinpath(*parts[:-1], parts[-1] + ".py") if parts else None
        if module in self.sources:
            loader = _Loader(module, self.sources[module])
            return importlib.util.spec_from_file_location(fullname, module, loader=loader)
        return None


class _Loader(importlib.abc.SourceLoader):
    """One module's source from the snapshot (without ``path_stats``, no ``.pyc`` is read or written)."""

    def __init__(self, path: Path, source: bytes):
        self.path, self.source = str(path), source

    def get_filename(self, fullname: str) -> str:
        return self.path

    def get_data(self, path: str) -> bytes:
        return self.source if path == self.path else Path(path).read_bytes()  # (only ever asked for its source)


def snapshot() -> Snapshot | None:
    """The snapshot this process runs kdpipe from, if any."""
    return next((finder for finder in sys.meta_path if isinstance(finder, Snapshot)), None)


def pause(point: str) -> None:
    """For the tests of edits made while a job starts (:data:`PAUSE_ENV`: ``POINT=FILE`` or ``POINT@STAGE=FILE``):
    at ``point``, create ``FILE`` and wait until it is removed."""
    for item in os.environ.get(PAUSE_ENV, "").split(","):
        name, _, marker = item.partition("=")
        name, _, stage = name.partition("@")
        if name == point and marker and (not stage or stage in sys.argv):
            Path(marker).touch()
            while os.path.exists(marker):
                time.sleep(0.02)
