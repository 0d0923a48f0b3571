"""Checksums of artifact files, recorded in their manifest by the writer and verified by every reader
(docs/caching-and-reruns.md, "Verified artifacts").

Each manifest lists an xxh3-64 digest of every file it describes (streamed, about 10 GB/s); a mismatch names the
file, both digests and the command that rebuilds it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import xxhash

from kdpipe.core.store import ArtifactError, read_json, write_json

CHUNK = 16 << 20


def checksum(path: str | Path) -> str:
    """``xxh3_64:<hex>`` of a file's bytes, read in chunks (memory flat in the file size)."""
    digest = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return f"xxh3_64:{digest.hexdigest()}"


def rebuild_hint(target: str | Path, path: str | Path | None = None) -> str:
    """How to rebuild ``target`` (what ``--forcerun`` makes again), given the damaged ``path`` in it; a file linked
    from the shared cache is damaged in the entry itself, which must go first."""
    hint = f"rebuild it with: snakemake --forcerun {target} (plus your usual options)"
    entry = _linked_entry(Path(target), Path(path) if path is not None else None)
    if entry is None:
        return hint
    return (
        f"it is linked from the shared cache entry {entry}, which is damaged itself: remove that entry "
        f"(rm -r {entry}) so that no run links it again, then {hint}"
    )


def _linked_entry(target: Path, path: Path | None) -> Path | None:
    """The cache entry a damaged file comes from (the link target of the output or of the file), or None."""
    if target.is_symlink():
        return Path(os.path.realpath(target))
    if path is not None and path.is_symlink():
        real = Path(os.path.realpath(path))
        return real.parent if target.is_dir() else real
    return None


def verify(manifest: dict, manifest_file: str | Path, names: Iterable[str], target: str | Path) -> None:
    """Fail when a file among ``names`` (beside ``manifest_file``) differs from the digest its manifest recorded (a
    manifest without checksums checks nothing); ``target``: what ``--forcerun`` rebuilds."""
    sums = manifest.get("checksums")
    if not sums:
        return
    folder = Path(manifest_file).parent
    for name in names:
        path = folder / name
        if name not in sums:
            raise ArtifactError(f"{path}: not listed in {manifest_file}; {rebuild_hint(target, path)}")
        if not path.is_file():
            raise ArtifactError(f"{path}: missing, though {manifest_file} lists it; {rebuild_hint(target, path)}")
        have = checksum(path)
        if have != sums[name]:
            raise ArtifactError(
                f"{path}: changed since kdpipe wrote it (checksum {have}, but {manifest_file} recorded "
                f"{sums[name]}): it was edited or damaged, so it is not used; {rebuild_hint(target, path)}"
            )


def write_manifest(path: str | Path, manifest: dict, names: Iterable[str]) -> dict:
    """Write ``manifest`` to ``path`` with the checksums of the files ``names`` beside it added; return it."""
    sums = {**(manifest.get("checksums") or {}), **{name: checksum(Path(path).parent / name) for name in names}}
    manifest = {**manifest, "checksums": sums}
    write_json(path, manifest)
    return manifest


def verify_folder(folder: str | Path) -> dict | None:
    """:func:`verify` every file a folder's manifest lists; its manifest, or None for a folder kdpipe did not write."""
    manifest_file = Path(folder) / "manifest.json"
    if not manifest_file.is_file():
        return None
    manifest = read_json(manifest_file)
    verify(manifest, manifest_file, sorted(manifest.get("checksums") or {}), target=folder)
    return manifest
