"""What a job's outputs are made from, as one identity (docs/caching-and-reruns.md, "One identity per job").

A job's identity covers its config slice, the content of every local file or folder the config names
(:func:`local_content`), the checksums of its input artifacts, and the stage's code fingerprint
(:mod:`kdpipe.core.fingerprint`). Resume checkpoints and kept copies of finished outputs are keyed on it;
:func:`what_changed` says why one of another identity is not used. Torch-free: the plan calls :func:`local_content`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path

import xxhash

from kdpipe.core.checksums import checksum
from kdpipe.core.memo import JsonMemo
from kdpipe.core.settings import Settings
from kdpipe.core.store import KdpipeError

# The libraries whose version changes what a job computes; part of every code fingerprint.
LIBRARIES = ("torch", "transformers", "tokenizers")
# Artifacts the workflow makes are tracked by Snakemake itself (and may not exist yet when the DAG is built)
RESULTS = "results"
# A large file's digest is kept with its size, times and inode, so a no-op rerun does not read it again
_MEMO = "kdpipe-content.json"
_MEMO_MIN_BYTES = 1 << 20
_RACY_NS = 2_000_000_000


@cache
def software_versions() -> dict[str, str]:
    """``{library: version}`` of :data:`LIBRARIES` (read from the installed metadata, nothing imported)."""
    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def local_path(value) -> Path | None:
    """``value`` as a local file or folder outside ``results/``, or None (a builtin, a hub name, an artifact)."""
    if not isinstance(value, str) or not value or ":" in value.split("/")[0]:
        return None  # builtin:..., hf:..., a URL
    path = Path(value)
    if not path.exists() or path.resolve().is_relative_to(Path(RESULTS).resolve()):
        return None
    return path


def local_content(paths: Mapping[str, object]) -> dict[str, str]:
    """``{name: digest}`` of each of ``paths`` (``{config key: value}``) that is a local file or folder."""
    return {name: content_digest(path) for name, value in paths.items() if (path := local_path(value)) is not None}


def check_local_content(planned: Mapping[str, str], paths: Mapping[str, object]) -> None:
    """Stop a job whose local files ``paths`` changed after the plan digested them into its slice (``planned``): it
    would read the new bytes under the old identity, and the shared cache would file them under it."""
    now = local_content(paths) if planned else {}
    changed = [key for key in planned if now.get(key) != planned[key]]
    if changed:
        raise KdpipeError(
            f"{', '.join(changed)}: the file or folder changed after the workflow was planned; run the workflow "
            "again, so that this job's identity is made from what it reads"
        )


def content_digest(path: str | Path) -> str:
    """``xxh3_128:<hex>`` of a file's bytes, or of a folder's files (relative paths and bytes, sorted)."""
    path = Path(path)
    memo = JsonMemo(_MEMO)
    digest = xxhash.xxh3_128()
    if path.is_file():
        digest.update(_memo_sum(memo, path).encode())
    else:
        for file in sorted(_files(path)):
            digest.update(file.relative_to(path).as_posix().encode() + b"\0" + _memo_sum(memo, file).encode() + b"\0")
    memo.save()
    return f"xxh3_128:{digest.hexdigest()}"


def _files(folder: Path) -> Iterable[Path]:
    for root, _dirs, names in os.walk(folder, followlinks=True):
        for name in names:
            yield Path(root) / name


def _memo_sum(memo: JsonMemo, file: Path) -> str:
    """A file's checksum, a large file's kept in ``memo`` by size, times and inode (an edit in place changes ctime)."""
    stat = file.stat()
    if stat.st_size < _MEMO_MIN_BYTES:
        return checksum(file)
    key = str(file.resolve())
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino]
    entry = memo.get(key)
    if entry and entry[:4] == stamp:
        return entry[4]
    value = checksum(file)
    # (only files older than a coarse clock's tick: an edit within it keeps the times, as git's index knows)
    if time.time_ns() - max(stat.st_mtime_ns, stat.st_ctime_ns) > _RACY_NS:
        memo.put(key, [*stamp, value])
    return value


def job_identity(settings: Settings, inputs: Iterable[str | Path], code: str) -> str:
    """``settings=… inputs=… code=…``: hashes of the settings (local files' digests included), of the input
    artifacts (a folder by its JSON files, whose manifests hold the checksums of the others; a file by the checksum
    its manifest records, else its bytes), and the code fingerprint ``code``."""
    settings_hash = xxhash.xxh3_64(settings.canonical().encode())
    artifacts = xxhash.xxh3_64()
    for item in sorted({str(i) for i in inputs}):
        path = Path(item)
        artifacts.update(item.encode() + b"\0")
        if path.is_dir():
            for file in sorted(path.rglob("*.json")):
                artifacts.update(file.relative_to(path).as_posix().encode() + b"\0" + checksum(file).encode())
        elif path.is_file():
            artifacts.update(_recorded_checksum(path).encode())
    return f"settings={settings_hash.hexdigest()} inputs={artifacts.hexdigest()} code={code}"


def what_changed(old: str, new: str) -> str:
    """Why something kept under identity ``old`` is not used by a job of identity ``new``: ``other code``..."""
    parts = [dict(part.split("=", 1) for part in key.split() if "=" in part) for key in (old, new)]
    names = [name for name in ("settings", "inputs", "code") if parts[0].get(name) != parts[1].get(name)]
    if set(parts[0]) != {"settings", "inputs", "code"} or not names:
        return "other settings, inputs or code"
    return "other " + " and ".join(names)


def _recorded_checksum(path: Path) -> str:
    """A file by the checksum a JSON manifest beside it records, else (a JSON file too) by its bytes."""
    if path.suffix != ".json":
        for manifest in sorted(path.parent.glob("*.json")):
            try:
                sums = json.loads(manifest.read_text()).get("checksums") or {}
            except (OSError, ValueError, AttributeError):
                continue
            if path.name in sums:
                return f"{manifest.name}:{sums[path.name]}"
    return checksum(path)
