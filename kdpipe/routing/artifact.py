"""The cached routing artifact of one route, ``results/routes/<route>/`` (docs/design.md, "Artifacts").

``train.parquet`` and ``validation.parquet`` hold row_id and scores (list<float32>[K], teachers in the manifest's
order); ``transfer.parquet`` and ``transfer.json`` the transfer rows' (kdpipe.routing.transfer); ``route.json`` the
manifest: teachers, router, ``weighting`` (``softmax`` of s/τ_s or the ``scores`` themselves), calibration
temperatures, the diagnostics and ``ood_auroc``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.checksums import verify
from kdpipe.core.store import ArtifactError, KdpipeError, read_manifest

FILES = ("train.parquet", "validation.parquet", "route.json")
TRANSFER_FILES = ("transfer.parquet", "transfer.json")  # the transfer rows' scores, beside (kdpipe.routing.transfer)


def write_scores(path: Path, row_ids: np.ndarray, scores: np.ndarray) -> None:
    column = pa.FixedSizeListArray.from_arrays(pa.array(np.asarray(scores, np.float32).ravel()), scores.shape[1])
    pq.write_table(pa.table({"row_id": pa.array(row_ids, pa.int64()), "scores": column}), path)


def read_route(route_dir: str | Path, split: str, row_ids: np.ndarray, teachers: list[str]) -> tuple[np.ndarray, dict]:
    """The scores [N, K] of ``split`` in the order of ``row_ids`` and ``teachers``, and the manifest, checked."""
    route_dir = Path(route_dir)
    manifest_file = route_dir / (TRANSFER_FILES[1] if split == "transfer" else FILES[-1])
    manifest = read_manifest(manifest_file, kind="route")
    path = route_dir / f"{split}.parquet"
    verify(manifest, manifest_file, [path.name], target=path)
    if manifest["teachers"] != list(teachers):
        raise KdpipeError(f"{route_dir}: routes teachers {manifest['teachers']}, the student learns from {teachers}")
    table = pq.read_table(path)
    if not np.array_equal(table.column("row_id").to_numpy(), row_ids):
        raise ArtifactError(f"{path}: row_ids are not those of the data split (other data, or another order)")
    column = table.column("scores").combine_chunks()
    return column.flatten().to_numpy().reshape(-1, column.type.list_size), manifest
