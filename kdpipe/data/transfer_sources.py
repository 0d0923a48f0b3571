"""Where the config says the transfer rows come from (kdpipe.data.transfer), read without numpy or pandas: the plan
imports it when the DAG is built."""

from __future__ import annotations

# The keys of the dataset section that say what the transfer rows are: the transfer job's slice, not the prepare
# job's, so that a change of transfer data reruns no teacher.
TRANSFER_KEYS = ("transfer", "transfer_max_rows")


def transfer_sources(dataset: dict) -> list[str]:
    """The configured ``dataset.transfer`` sources as a list (a single file or folder, or per-part files)."""
    value = dataset.get("transfer")
    if value in (None, "", []):
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def has_transfer(dataset: dict) -> bool:
    """Whether the dataset has transfer rows: ``dataset.transfer`` or withheld training labels."""
    return bool(transfer_sources(dataset)) or bool((dataset.get("split") or {}).get("unlabelled"))
