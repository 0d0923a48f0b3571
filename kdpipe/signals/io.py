"""Teacher signal artifacts under ``results/signals/{teacher}/{split}/``: writers' layout and checked readers.

Files: docs/design.md, "The signal catalog" (and Meta-KD's prototype scores). Each is stored in its split's row
order with a manifest beside it (``<signal>.json``: rows, the teacher's labels, the split); a reader checks the file
against both and names the file when they differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.checksums import rebuild_hint, verify
from kdpipe.core.store import ArtifactError, read_manifest
from kdpipe.signals.packed import SIDECARS, TOKENS, item_shape, row_counts, sidecar


def manifest_path(signal_file: str | Path) -> Path:
    """``.../logits.parquet`` -> ``.../logits.json``; ``mc.npy`` and ``mc.parquet`` share ``mc.json``."""
    p = Path(signal_file)
    return p.with_name(p.name.split(".")[0] + ".json")


def write_logits(path: Path, row_ids: np.ndarray, logits: np.ndarray) -> None:
    width = logits.shape[1]
    column = pa.FixedSizeListArray.from_arrays(pa.array(logits.astype(np.float32).ravel()), width)
    pq.write_table(pa.table({"row_id": pa.array(row_ids, pa.int64()), "logits": column}), path)


def load_npy(path: Path) -> np.ndarray:
    """A memory-mapped ``.npy``; a damaged file is an error naming it."""
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError, EOFError) as err:
        raise ArtifactError(f"{path}: cannot be read as a .npy array ({err}); {rebuild_hint(path)}") from err


def _manifest(path: Path, kind: str | None, names: list[str] | None = None) -> dict:
    """The manifest beside the signal file ``path``, of ``kind``, with the checksums of ``names`` verified."""
    manifest = read_manifest(manifest_path(path), kind=kind)
    verify(manifest, manifest_path(path), names or [path.name], target=path)
    return manifest


def _check_rows(path: Path, manifest: dict, row_ids: np.ndarray, file_rows: int, file_row_ids=None) -> None:
    """The file holds its manifest's rows, those of the data split (and its ``file_row_ids``, when it stores them)."""
    if file_rows != manifest["rows"]:
        raise ArtifactError(
            f"{path}: holds {file_rows} rows but its manifest {manifest_path(path)} says "
            f"{manifest['rows']}: the file is truncated or was replaced; {rebuild_hint(path)}"
        )
    if manifest["rows"] != len(row_ids):
        raise ArtifactError(
            f"{path}: made for {manifest['rows']} rows of split '{manifest.get('split')}', but the "
            f"data split has {len(row_ids)} rows: rebuild the teacher's signals"
        )
    if file_row_ids is not None and not np.array_equal(file_row_ids, row_ids):
        raise ArtifactError(f"{path}: row_ids are not those of the data split (other data, or another order)")


def _check_labels(path: Path, manifest: dict, width: int, labels: list[str] | None) -> None:
    if len(manifest["labels"]) != width:
        raise ArtifactError(
            f"{path}: has {width} classes per row but its manifest lists {len(manifest['labels'])} "
            f"labels {manifest['labels']}"
        )
    if labels is not None and manifest["labels"] != list(labels):
        raise ArtifactError(f"{path}: label list {manifest['labels']} differs from the expected {list(labels)}")


def read_logits(path: str | Path, row_ids: np.ndarray, labels: list[str] | None = None) -> tuple[np.ndarray, list[str]]:
    """Logits [N, C] aligned with ``row_ids`` (the split's row order), and the teacher's label list."""
    path = Path(path)
    manifest = _manifest(path, "logits")
    table = pq.read_table(path)
    _check_rows(path, manifest, row_ids, table.num_rows, table.column("row_id").to_numpy())
    column = table.column("logits").combine_chunks()
    width = column.type.list_size
    logits = column.flatten().to_numpy().reshape(-1, width)
    _check_labels(path, manifest, width, labels)
    return logits, manifest["labels"]


def read_mc(npy_path: str | Path, row_ids: np.ndarray, labels: list[str] | None = None):
    """MC-dropout mean probabilities [N, C] (memory-mapped) and the score table, both checked."""
    npy_path = Path(npy_path)
    manifest = _manifest(npy_path, "mc", [npy_path.name, npy_path.with_suffix(".parquet").name])
    probs = load_npy(npy_path)
    _check_rows(npy_path, manifest, row_ids, probs.shape[0])
    _check_labels(npy_path, manifest, probs.shape[1], labels)
    scores = pq.read_table(npy_path.with_suffix(".parquet")).to_pandas()
    _check_rows(npy_path.with_suffix(".parquet"), manifest, row_ids, len(scores), scores["row_id"].to_numpy())
    return probs, scores


def read_features(npy_path: str | Path, row_ids: np.ndarray, layers: list[int] | None = None):
    """A packed feature dump (:mod:`kdpipe.signals.packed`), checked: data, offsets, tokens and manifest."""
    npy_path = Path(npy_path)
    feature = npy_path.name.split(".")[0]
    names = [npy_path.name, *(sidecar(npy_path.name, which) for which in SIDECARS)]
    manifest = _manifest(npy_path, None, names)
    data, offsets, tokens = (load_npy(npy_path.with_name(name)) for name in names)
    _check_rows(npy_path, manifest, row_ids, len(tokens))
    if layers is not None and any(layer not in manifest["layers"] for layer in layers):
        raise ArtifactError(f"{npy_path}: holds layers {manifest['layers']}, the reader needs {layers}")
    offsets, tokens = np.asarray(offsets), np.asarray(tokens)
    n_layers = len(manifest["layers"])
    counts = row_counts(feature, tokens["length"], n_layers, manifest["heads"])
    expected = item_shape(feature, n_layers, manifest["hidden_size"])
    if (
        tokens.dtype != TOKENS
        or offsets.shape != (len(tokens) + 1,)
        or not np.array_equal(np.diff(offsets), counts)
        or offsets[0] != 0
        or data.shape != (offsets[-1], *expected)
    ):
        raise ArtifactError(
            f"{npy_path}: shape {data.shape} does not fit its offsets and row lengths (expected "
            f"{(int(counts.sum()), *expected)}); {rebuild_hint(npy_path)}"
        )
    return data, offsets, tokens, manifest


def read_npy(npy_path: str | Path, row_ids: np.ndarray, kind: str) -> tuple[np.ndarray, dict]:
    """A per-row ``.npy`` signal (memory-mapped) checked against its manifest and ``row_ids``, and the manifest."""
    npy_path = Path(npy_path)
    manifest = _manifest(npy_path, kind)
    array = load_npy(npy_path)
    _check_rows(npy_path, manifest, row_ids, array.shape[0])
    return array, manifest


def read_pooled(npy_path: str | Path, row_ids: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Pooled last-layer states [N, H] (float32, in memory) of the split's ``row_ids``, and the teacher's labels."""
    array, manifest = read_npy(npy_path, row_ids, "pooled")
    return np.asarray(array, dtype=np.float32), manifest["labels"]


def read_table(path: str | Path, row_ids: np.ndarray, kind: str) -> pd.DataFrame:
    """A per-row Parquet signal (prototype scores, domain expertise) checked against its manifest and ``row_ids``."""
    path = Path(path)
    table = pq.read_table(path).to_pandas()
    _check_rows(path, _manifest(path, kind), row_ids, len(table), table["row_id"].to_numpy())
    return table


def read_prototype_scores(path: str | Path, row_ids: np.ndarray) -> np.ndarray:
    """Meta-KD's prototype scores t [N] (float32) of the train rows ``row_ids``."""
    return read_table(path, row_ids, "prototypes")["score"].to_numpy(dtype=np.float32)


def read_domain(npy_path: str | Path, row_ids: np.ndarray):
    """A meta-teacher's domain signals (``kdpipe.methods.meta_kd.domain``): the memory-mapped domain
    representations [N, H] (float16), the expertise weights [N] (float32) and the manifest, checked."""
    rep, manifest = read_npy(npy_path, row_ids, "domain")
    table = read_table(Path(npy_path).with_suffix(".parquet"), row_ids, "domain")
    return rep, table["expertise"].to_numpy(dtype=np.float32), manifest
