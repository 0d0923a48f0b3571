"""A prompted teacher's pass gathered from its shards, and its members' probabilities read back (docs/methods.md §7).

Torch-free at import (the ``prompt-gather`` and ``evaluate-prompted`` jobs run no model): the ``logits``, ``mc`` and
``pooled`` artifacts are written by the signal modules of :mod:`kdpipe.signals.shards` (the same files as a classifier
teacher's), ``prompt.npy`` (every member's probabilities, rows first, float32 [N, K, C]) and ``prompt.json`` here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.checksums import verify, write_manifest
from kdpipe.core.store import ArtifactError, atomic_path, ensure_disk_space, make_manifest, read_manifest
from kdpipe.signals.parts import gather_array, read_parts
from kdpipe.signals.prompt_settings import PromptPassSettings
from kdpipe.signals.settings import SignalSettings

SIGNALS = ("logits", "mc", "pooled")  # the catalog's signals a prompted pass makes
PROMPT_FILES = ("prompt.npy", "prompt.json")  # every member's probabilities, rows first [N, K, C], and its manifest


def signal_settings(settings: PromptPassSettings, signal: str) -> SignalSettings:
    """What the ``logits`` or ``mc`` artifact of a prompted pass records as its settings: the signal, the split and
    the batch size (the prompt settings are in its manifest's ``teacher``)."""
    return SignalSettings(signal=signal, split=settings.split, batch_size=settings.batch_size)


def write(settings: PromptPassSettings, meta: dict, parts, out_dir: str | Path) -> dict:
    """``prompt.npy`` (every member's probabilities, rows first: float32 [N, K, C]) and ``prompt.json`` (kind
    ``prompt``) in ``out_dir`` from the parts of every shard (``(rows, folder)`` of each, as
    :func:`kdpipe.signals.parts.read_parts` gives them; the signal modules' ``write`` of the shard protocol);
    returns the manifest."""
    out_dir = Path(out_dir)
    npy, manifest_file = (out_dir / name for name in PROMPT_FILES)
    size = 4 * meta["rows"] * len(meta["members"]) * len(meta["labels"])
    ensure_disk_space(npy, size, "the prompt members", "free space")
    with atomic_path(npy) as tmp, open(tmp, "wb") as fh:
        np.save(fh, gather_array(parts, "members", meta["rows"]))
    manifest = make_manifest("prompt", config=settings, split=settings.split, **meta)
    return write_manifest(manifest_file, manifest, [npy.name])


def gather_members(settings: PromptPassSettings, part_dirs: list[str | Path], out_dir: str | Path) -> dict:
    """:func:`write` from the part folders of every shard (their ``prompt`` sub-folders)."""
    meta, parts = read_parts([Path(part) / "prompt" for part in part_dirs])
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return write(settings, meta, parts, out_dir)


def gather(settings: PromptPassSettings, parts: list[Path], out: Path) -> dict[str, dict]:
    """The ``logits``, ``mc``, ``pooled`` and ``prompt`` artifacts of a prompted pass in the signal folder ``out``,
    from the part folders of every shard (:func:`kdpipe.signals.shards.gather` for the first three, the same files as
    a classifier teacher's); returns the manifest of each."""
    from kdpipe.signals.shards import gather as gather_signal  # (it imports each signal's module by name)

    manifests = {name: gather_signal(signal_settings(settings, name), parts, out) for name in SIGNALS}
    manifests["prompt"] = gather_members(settings, parts, out)
    return manifests


def read_members(npy_path: str | Path, row_ids: np.ndarray, labels: list[str] | None = None):
    """Every member's probabilities [K, N, C] (a view of the memory-mapped file) and the manifest, checked: the
    file against its checksum, its rows against ``row_ids``' count, its classes against ``labels``."""
    npy_path = Path(npy_path)
    manifest_file = npy_path.with_name(PROMPT_FILES[1])
    manifest = read_manifest(manifest_file, kind="prompt")
    verify(manifest, manifest_file, [npy_path.name], target=npy_path)
    array = np.load(npy_path, mmap_mode="r")
    if array.shape != (manifest["rows"], len(manifest["members"]), len(manifest["labels"])):
        raise ArtifactError(f"{npy_path}: shape {array.shape} does not fit its manifest; rebuild it")
    if manifest["rows"] != len(row_ids):
        raise ArtifactError(f"{npy_path}: made for {manifest['rows']} rows, the data split has {len(row_ids)}")
    if labels is not None and manifest["labels"] != list(labels):
        raise ArtifactError(f"{npy_path}: label list {manifest['labels']} differs from the expected {list(labels)}")
    return array.transpose(1, 0, 2), manifest
