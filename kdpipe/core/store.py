"""Reading and writing artifacts: atomic outputs, JSON, manifests and their checks (docs/design.md, "Contracts").

Every output is written under a temporary name that names its process (``.{name}.tmp-{host}-{pid}-…``) and renamed
into place when complete; the next write of the path removes what a killed process left.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from kdpipe import __version__


class KdpipeError(Exception):
    """An error caused by the user's input or configuration; the CLI prints it without a traceback."""


class ArtifactError(KdpipeError):
    """An artifact on disk does not fit what its reader expects (row count, labels, tokenizer, kind)."""


@contextlib.contextmanager
def atomic_path(path: str | Path, *, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path (a directory with ``directory``) beside ``path``, moved onto it if the block finishes
    (an existing directory is replaced); on an exception it is removed and nothing at ``path`` changes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_left_behind(path)
    prefix = f".{path.name}.tmp-{_HOST}-{os.getpid()}-"
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=prefix, dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        _default_permissions(tmp)
        if directory and path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp) if tmp.is_dir() else tmp.unlink()


_HOST = socket.gethostname().replace("-", "_")  # (no "-": the name's fields are split on it)


@contextlib.contextmanager
def scratch_folder(near: str | Path) -> Iterator[Path]:
    """A temporary folder beside ``near``, removed at the end (named as :func:`atomic_path` names its paths)."""
    near = Path(near)
    near.parent.mkdir(parents=True, exist_ok=True)
    _remove_left_behind(near)
    prefix = f".{near.name}.tmp-{_HOST}-{os.getpid()}-"
    with tempfile.TemporaryDirectory(prefix=prefix, dir=near.parent, ignore_cleanup_errors=True) as tmp:
        yield Path(tmp)


def _remove_left_behind(path: Path) -> None:
    """Remove the temporary paths of ``path`` left by a process of this host that is gone (killed mid-write).
    Another host's are kept: its process ids mean nothing here (a shared file system under SLURM)."""
    for tmp in path.parent.glob(f".{glob.escape(path.name)}.tmp-{glob.escape(_HOST)}-*"):
        pid = tmp.name[len(f".{path.name}.tmp-{_HOST}-") :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # (another user's live process)
        return True
    return True


def _default_permissions(path: Path) -> None:
    """Give outputs the umask's modes (mkstemp/mkdtemp make them private), so others can read them."""
    umask = os.umask(0)
    os.umask(umask)
    paths = [path, *path.rglob("*")] if path.is_dir() else [path]
    for p in paths:
        p.chmod((0o777 if p.is_dir() else 0o666) & ~umask)


# The bounds of the room kept free on a disk after a write (disk_reserve)
DISK_RESERVE = 64_000_000
DISK_RESERVE_MAX = 1_000_000_000


DUMP_HINT = (
    "dump fewer layers (a student with fewer layers aligns with fewer), a shorter max_length, attentions averaged "
    "over heads (method_args.stage1.attention_heads: mean), or free space"
)


def disk_reserve(nbytes: int) -> int:
    """The room kept free after a write of ``nbytes``: as much again (a dump's shards and their gather coexist; a new
    checkpoint is written before the old one goes), at least 64 MB (logs, other jobs' small files) and at most 1 GB,
    so a small model folder still fits on a nearly full disk."""
    return min(max(int(nbytes), DISK_RESERVE), DISK_RESERVE_MAX)


def ensure_disk_space(path: str | Path, nbytes: int, what: str, hint: str = DUMP_HINT) -> None:
    """Refuse, before writing, an output of ``nbytes`` that would not fit on the disk of ``path`` with
    :func:`disk_reserve` kept free: a write that fails half-way wastes the work before it (a memory-mapped array on
    a full disk dies with SIGBUS)."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    reserve = disk_reserve(nbytes)
    if nbytes + reserve > free:
        raise KdpipeError(
            f"{what} needs {_bytes(nbytes)} at {folder}, but only {_bytes(free)} are free "
            f"(and {_bytes(reserve)} are kept in reserve): {hint}"
        )


def _bytes(n: int) -> str:
    """A size for a message, to three digits: bytes, kB, MB or GB (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            value = n / scale
            text = f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"
            return f"{text.rstrip('0').rstrip('.') if '.' in text else text} {unit}"
    return f"{n} bytes"


def tensor_bytes(module) -> int:
    """Bytes of a module's parameters and buffers as saved (what a model file or a checkpoint's weights take)."""
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{path}: missing (was the stage that writes it run?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ArtifactError(f"{path}: not valid JSON ({err})") from err


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class Recorded(Protocol):
    """What a manifest records of the job's settings (:class:`kdpipe.core.settings.Settings`)."""

    def to_dict(self) -> dict: ...


def make_manifest(kind: str, *, config: Recorded | None = None, **fields: Any) -> dict:
    """A manifest: what the artifact is, the config slice that made it, plus any checked ``fields``."""
    return {
        "kind": kind,
        "kdpipe_version": __version__,
        "config": None if config is None else config.to_dict(),
        **fields,
    }


def check_manifest(manifest: dict, source: str | Path, **expected: Any) -> dict:
    """Fail with a message naming ``source`` and the field when a manifest field differs from ``expected``."""
    for key, want in expected.items():
        have = manifest.get(key)
        if have != want:
            raise ArtifactError(
                f"{source}: manifest field '{key}' is {_short(have)} but the reader expects {_short(want)}; "
                "the artifact was made for other data or another model: rebuild it"
            )
    return manifest


def read_manifest(path: str | Path, *, kind: str | None = None, **expected: Any) -> dict:
    """Read a manifest and check its ``kind`` and any ``expected`` fields."""
    manifest = read_json(path)
    if kind is not None:
        expected = {"kind": kind, **expected}
    return check_manifest(manifest, path, **expected)


def _short(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, default=_json_default)
    return text if len(text) <= limit else text[: limit - 3] + "..."
