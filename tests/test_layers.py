"""The package's floors (docs/design.md, "Layers"): no kdpipe module imports one of a higher floor, and no import
cycle, found by reading every import statement (lazy ones in functions too) and every ``importlib.import_module``
of a literal name."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

from tests.conftest import REPO

# Lowest first; a module imports its own package's modules and those of the floors below (docs/design.md, "Layers")
FLOORS = (
    ("kdpipe",),  # the package's __init__: names only
    ("core",),
    ("data", "evaluation"),
    ("models",),
    ("signals", "training"),
    ("routing",),
    ("methods", "report"),
    ("plan", "stages"),
    ("launcher",),  # the package's own modules: __main__, cli, launch
)
LAUNCHER = ("__main__", "cli", "launch")


def modules() -> dict[str, Path]:
    found = {}
    for path in (REPO / "kdpipe").rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The kdpipe modules ``name`` imports: a ``from package import module`` counts as the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_bytes())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).rstrip(".")
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            found.update(arg.value for arg in node.args[:1] if isinstance(arg, ast.Constant))
    return {module for module in found if module in known and module != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def floor(module: str) -> tuple[int, str]:
    package = module.split(".")[1] if "." in module else "kdpipe"
    package = "launcher" if package in LAUNCHER else package
    return next(i for i, names in enumerate(FLOORS) if package in names), package


def test_every_module_is_on_a_floor():
    assert all(floor(module) for module in graph())


def test_no_module_imports_a_higher_floor():
    climbs = []
    for module, imported in graph().items():
        level, package = floor(module)
        for other in imported:
            other_level, other_package = floor(other)
            if other_package != package and other_level >= level and other_package != "kdpipe":
                climbs.append(f"{module} -> {other}")
    assert not climbs, climbs


def test_no_import_cycles():
    edges = graph()
    try:
        TopologicalSorter(edges).prepare()
    except CycleError as err:
        raise AssertionError(f"an import cycle: {' -> '.join(err.args[1])}") from None


def test_the_checker_finds_a_climb_and_a_cycle(tmp_path):
    """What the tests above read: a lazy import, a relative one, an import_module of a literal name."""
    source = "def f():\n    from . import shards\n    import importlib\n    importlib.import_module('kdpipe.stages')\n"
    (tmp_path / "forward.py").write_text(source)
    known = {"kdpipe.signals.shards": None, "kdpipe.stages": None, "kdpipe.signals.forward": None}
    found = imports("kdpipe.signals.forward", tmp_path / "forward.py", known)
    assert found == {"kdpipe.signals.shards", "kdpipe.stages"}
    assert floor("kdpipe.stages")[0] > floor("kdpipe.signals.forward")[0]
