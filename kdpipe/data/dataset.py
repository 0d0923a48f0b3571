"""Readers of a prepared dataset artifact (``results/data/<name>/``, written by :mod:`kdpipe.data.prepare`).

Every reader checks what it reads against the artifact's ``manifest.json`` and names the file when they differ.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from kdpipe.core.checksums import verify
from kdpipe.core.store import ArtifactError, KdpipeError, check_manifest, read_json, read_manifest

SPLITS = ("train", "validation", "test")
# A transfer artifact (kdpipe.data.transfer) has this one split, of rows without a gold label
TRANSFER = "transfer"
# The out-of-distribution rows (evaluate.ood): a split of the dataset artifact (held-out classes) or of its own one
OOD = "ood"
# The label id of a row without a gold label (a transfer row): torch's cross-entropy ignores it by default
NO_LABEL = -100


def read_split(data_dir: str | Path, split: str) -> pd.DataFrame:
    """One split of a dataset artifact, checked against the row count in its manifest."""
    if split not in (*SPLITS, TRANSFER, OOD):
        raise KdpipeError(f"unknown split '{split}'; expected one of {', '.join(SPLITS)}, {TRANSFER}, {OOD}")
    data_dir = Path(data_dir)
    manifest = read_manifest(data_dir / "manifest.json", kind="dataset")
    path = data_dir / f"{split}.parquet"
    if not path.exists():
        raise ArtifactError(f"{path}: missing (rerun the prepare stage)")
    verify(manifest, data_dir / "manifest.json", [path.name], target=data_dir)
    frame = pd.read_parquet(path)
    expected = manifest["rows"][split]
    if len(frame) != expected:
        raise ArtifactError(
            f"{path}: {len(frame)} rows but {data_dir / 'manifest.json'} says {expected}; "
            "the dataset artifact is damaged or mixed from two runs: rerun the prepare stage"
        )
    return frame


def read_labels(data_dir: str | Path) -> list[str]:
    """The dataset's label names in label_id order, checked against its manifest."""
    data_dir = Path(data_dir)
    labels = read_json(data_dir / "labels.json")
    manifest = read_manifest(data_dir / "manifest.json", kind="dataset")
    verify(manifest, data_dir / "manifest.json", ["labels.json"], target=data_dir)
    check_manifest(manifest, data_dir / "manifest.json", labels=labels)
    return labels


def dataset_domains(data_dir: str | Path) -> list[str] | None:
    """The dataset's domain names, sorted (their index is the domain id), or None without a domain column."""
    return read_manifest(Path(data_dir) / "manifest.json", kind="dataset").get("domains")


def read_domains(data_dir: str | Path, where: str) -> list[str]:
    """:func:`dataset_domains`, where ``where`` needs them: an error naming it when the dataset has none."""
    domains = dataset_domains(data_dir)
    if not domains:
        raise no_domains(where)
    return domains


def no_domains(where: str) -> KdpipeError:
    return KdpipeError(
        f"{where} needs a domain per row, but the dataset has no domain column: set dataset.domain_column"
    )


def domain_ids(frame: pd.DataFrame, domains: list[str]) -> np.ndarray:
    """Each row's domain id (index in ``domains``)."""
    return frame["domain"].map({d: i for i, d in enumerate(domains)}).to_numpy(dtype=np.int64)


def restrict_to_domain(frame: pd.DataFrame, domain: str | None, domains: list[str] | None, where: str) -> pd.DataFrame:
    """The rows of ``domain`` (all rows for None); ``domains`` is the dataset's list (None: no domain column)."""
    if domain is None:
        return frame
    if not domains:
        raise no_domains(f"{where}: domain {domain!r}")
    if domain not in domains:
        raise KdpipeError(f"{where}: unknown domain {domain!r}; the data's domains are {domains}")
    return frame[frame["domain"] == domain].reset_index(drop=True)
