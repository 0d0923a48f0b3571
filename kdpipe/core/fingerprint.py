"""Code fingerprints: a hash of the kdpipe modules a stage uses (docs/caching-and-reruns.md, "Rerun rules").

A fingerprint covers a stage's entry module, its static import closure (found with ``ast``, importing nothing) and
the modules the plan names for it; what a module imports is remembered in ``.snakemake/kdpipe-imports.json``.
"""

from __future__ import annotations

import ast
import hashlib
import json
from functools import cache
from pathlib import Path

from kdpipe.core.identity import software_versions
from kdpipe.core.memo import JsonMemo

PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # the kdpipe package
_PARSER = hashlib.sha256(Path(__file__).read_bytes()).digest()  # a change to the parsing rules parses again
_snapshot: dict[Path, bytes] = {}  # a job's sources as it read them at its start (kdpipe.launch.Snapshot)


def read_sources_from(sources: dict[Path, bytes]) -> None:
    """Fingerprint the sources as ``sources`` hold them, not the disk (docs/design.md, "Which kdpipe a job runs")."""
    _snapshot.clear()
    _snapshot.update(sources)
    _module_file.cache_clear()


def module_file(module: str) -> Path | None:
    """The source file of a ``kdpipe.*`` module name, or None when it is not part of kdpipe."""
    return _module_file(PACKAGE_ROOT, module)


@cache
def _module_file(root: Path, module: str) -> Path | None:
    if module != "kdpipe" and not module.startswith("kdpipe."):
        return None
    if module == "kdpipe":
        return root / "__init__.py"
    rel = Path(*module.split(".")[1:])
    for candidate in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        if candidate in _snapshot if _snapshot else candidate.is_file():
            return candidate
    return None


def _source(path: Path) -> bytes:
    """A module's source, read once while the file stays as it is; in a job, as its snapshot holds it."""
    return _snapshot[path] if _snapshot else _read(path, _stamp(path))


def _stamp(path: Path) -> tuple[int, ...]:
    if _snapshot:  # the snapshot's bytes do not change: stamped by their content
        return (hash(_snapshot[path]),)
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino


@cache
def _read(path: Path, stamp: tuple[int, ...]) -> bytes:
    return path.read_bytes()


@cache
def _imports(path: Path, module: str, stamp: tuple[int, ...]) -> frozenset[str]:
    """The kdpipe modules that ``module`` (its source file ``path``, as of ``stamp``) imports anywhere in it."""
    source = _source(path)
    is_package = path.name == "__init__.py"
    key = hashlib.sha256(_PARSER + f"{module}\0{is_package}\0".encode() + source).hexdigest()
    names = _memo().get(key)
    if names is None:
        names = sorted(_imported_names(source, str(path), module, is_package))
        _memo().put(key, names)
    # which of the names are kdpipe modules is decided now, not remembered: a module file added since counts
    return frozenset(name for name in names if module_file(name))


@cache
def _memo() -> JsonMemo:
    return JsonMemo("kdpipe-imports.json", limit=2000)


def _imported_names(source: bytes, filename: str, module: str, is_package: bool) -> set[str]:
    """Every module name the source imports, resolved to absolute names, with the packages above each."""
    tree = ast.parse(source, filename=filename)
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    parents = {".".join(name.split(".")[:i]) for name in found for i in range(1, name.count(".") + 1)}
    return {name for name in found | parents if name == "kdpipe" or name.startswith("kdpipe.")}


@cache
def module_closure(*modules: str) -> tuple[Path, ...]:
    """The source files of ``modules`` and of every kdpipe module they import, transitively, sorted."""
    seen: dict[str, Path] = {}
    todo = list(modules)
    while todo:
        name = todo.pop()
        path = module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        todo.extend(_imports(path, name, _stamp(path)))
    _memo().save()
    return tuple(sorted(set(seen.values())))


# The library versions the workflow's fingerprints were computed with, for a job in another environment (conda)
VERSIONS_ENV = "KDPIPE_FINGERPRINT_VERSIONS"


def fingerprint(*modules: str, versions: dict[str, str] | None = None) -> str:
    """sha256 (16 hex digits) over the relative paths and contents of :func:`module_closure` and the library
    ``versions`` (default: :func:`kdpipe.core.identity.software_versions`), so an upgrade of torch reruns the jobs."""
    versions = software_versions() if versions is None else versions
    digest = hashlib.sha256(json.dumps(versions, sort_keys=True).encode())
    for path in module_closure(*modules):
        digest.update(str(path.relative_to(PACKAGE_ROOT)).encode() + b"\0" + _source(path) + b"\0")
    return digest.hexdigest()[:16]
