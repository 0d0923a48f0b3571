"""Where the config says the transfer rows come from (kdpipe.data.transfer), read without numpy or pandas: the plan
imports it when the DAG is built. It makes the cheap checks of local text sources then."""

from __future__ import annotations

import difflib
from pathlib import Path

from kdpipe.core.store import KdpipeError

# The keys of the dataset section in the transfer job's slice, not the prepare job's: they rerun no teacher
TRANSFER_KEYS = ("transfer", "transfer_max_rows")


def transfer_sources(transfer: str | list[str] | tuple[str, ...] | None) -> list[str]:
    """The configured ``dataset.transfer`` sources as a list."""
    if transfer in (None, "", [], ()):
        return []
    return [str(transfer)] if isinstance(transfer, str) else [str(v) for v in transfer]


def has_transfer(transfer: str | list[str] | tuple[str, ...] | None, unlabelled: float) -> bool:
    """Whether the dataset has transfer rows: ``dataset.transfer`` or ``dataset.split.unlabelled``."""
    return bool(transfer_sources(transfer)) or bool(unlabelled)


def check_transfer_files(dataset: dict) -> None:
    """:func:`check_text_source` of every transfer source of the config's ``dataset`` section (the workflow's entry
    point; the full read is the ``transfer`` job's)."""
    for source in transfer_sources(dataset["transfer"]):
        check_text_source(
            source,
            "dataset.transfer",
            text_column=dataset["text_column"],
            text_pair_column=dataset["text_pair_column"],
            fmt=dataset["format"],
            encoding=dataset["encoding"],
        )


def no_column(where: str, column: str, key: str, available: list[str]) -> KdpipeError:
    """The error for a configured ``column`` (config key ``key``) that the source at ``where`` lacks."""
    close = difflib.get_close_matches(column, available, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return KdpipeError(f"{where}: no column '{column}' ({key}); the columns are {available}{hint}")


def file_not_found(path: Path, key: str) -> KdpipeError:
    """The error for a local file named by config ``key`` that is not there."""
    where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    return KdpipeError(f"{path}: file not found{where}; check {key}")


def check_text_source(
    source: str,
    key: str,
    *,
    text_column: str,
    text_pair_column: str | None,
    fmt: str,
    encoding: str,
    column_keys: dict | None = None,
) -> None:
    """A local text source (a transfer file, the OOD file) exists, is not empty, has a data row and its text
    column(s), read cheaply; ``key`` and ``column_keys`` name the config keys in messages."""
    wanted = {text_column: "text_column", **({text_pair_column: "text_pair_column"} if text_pair_column else {})}
    path = Path(source)
    if source.startswith("hf:"):
        return
    if path.is_dir():
        if not saved_dataset(path):
            raise KdpipeError(
                f"{path}: a folder, but not one written by the datasets library's save_to_disk (no "
                f"dataset_dict.json or state.json in it); give a file, hf:NAME or such a folder ({key})"
            )
        if _saved_rows(path) == 0:
            raise KdpipeError(f"{path}: the saved dataset has no rows ({key})")
        columns = _saved_columns(path)
    elif not path.is_file():
        raise file_not_found(path, key)
    else:
        with open(path, "rb") as handle:
            if not handle.read(1 << 20).strip():
                raise KdpipeError(f"{path}: the file is empty ({key})")
        if not _has_rows(path, fmt):
            raise KdpipeError(f"{path}: no data rows, only a header ({key})")
        columns = _header(path, fmt, encoding)
    missing = [column for column in wanted if columns is not None and column not in columns]
    if missing:
        column_key = (column_keys or {}).get(wanted[missing[0]], f"dataset.{wanted[missing[0]]}")
        raise KdpipeError(f"{no_column(str(path), missing[0], column_key, columns)} ({key})")


def _suffix(path, fmt: str) -> str:
    """The file's format as its reader sees it: ``fmt``, or the extension with ``auto``."""
    return path.suffix.lower() if fmt == "auto" else f".{fmt}"


def _has_rows(path, fmt: str) -> bool:
    """Whether a file that is not empty has a data row (True for what cannot be told cheaply)."""
    suffix = _suffix(path, fmt)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except Exception:  # not Parquet: the transfer job says so with the reader's message
            return True
    if suffix not in (".csv", ".tsv"):
        return True  # (JSONL: a file that is not blank has a record)
    with open(path, "rb") as handle:
        handle.readline()
        return any(line.strip() for line in handle)


def _saved_columns(folder) -> list[str] | None:
    """The columns every split of a ``save_to_disk`` folder has (its ``dataset_info.json`` features), or None."""
    import json

    found = None
    for info in sorted(folder.rglob("dataset_info.json")):
        try:
            features = json.loads(info.read_text()).get("features")
        except (OSError, ValueError):
            return None
        if not isinstance(features, dict):
            return None
        found = list(features) if found is None else [c for c in found if c in features]
    return found


def _header(path, fmt: str, encoding: str) -> list[str] | None:
    """The column names of a CSV/TSV header, a Parquet schema or the first JSONL record, or None."""
    import csv
    import json

    suffix = _suffix(path, fmt)
    if suffix == ".jsonl":
        try:
            with open(path, encoding=encoding) as handle:
                first = next((line for line in handle if line.strip()), "").removeprefix("\ufeff")
            record = json.loads(first)
        except (UnicodeDecodeError, LookupError, ValueError):
            return None  # the transfer job reports the encoding or the bad line
        return list(record) if isinstance(record, dict) else None
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except Exception:  # not Parquet: the transfer job says so with the reader's message
            return None
    if suffix not in (".csv", ".tsv"):
        return None
    try:
        with open(path, encoding=encoding, newline="") as handle:
            first = handle.readline().removeprefix("\ufeff")
    except (UnicodeDecodeError, LookupError):
        return None  # the transfer job reports the encoding with the byte offset
    if suffix == ".tsv":
        return first.rstrip("\r\n").split("\t")
    return next(csv.reader([first]), [])


def transfer_rows_bound(sources: list[str], fmt: str, cap: int | None) -> int | None:
    """At most how many rows the transfer files ``sources`` give before any is dropped (at most ``cap``), counted
    cheaply (a record of several lines counts more than once); None for a Hugging Face dataset or a missing file."""
    total = 0
    for source in sources:
        path = Path(source)
        if path.is_dir() and saved_dataset(path):
            rows = _saved_rows(path)
            if rows is None:
                return None
            total += rows
            continue
        if source.startswith("hf:") or not path.is_file():
            return None
        suffix = _suffix(path, fmt)
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            try:
                total += pq.ParquetFile(path).metadata.num_rows
            except Exception:  # not Parquet: the transfer job says so
                return None
            continue
        lines, returns, last = 0, 0, b"\n"
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                lines += chunk.count(b"\n")
                returns += chunk.count(b"\r")
                last = chunk[-1:]
        lines = max(lines, returns) + (last not in (b"\n", b"\r"))  # a file of "\r" line ends counts those
        total += max(0, lines - (suffix in (".csv", ".tsv")))
    return total if cap is None else min(total, cap)


def saved_dataset(folder) -> bool:
    """A folder written by ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``)."""
    return any((folder / name).is_file() for name in ("dataset_dict.json", "state.json"))


def _saved_rows(folder) -> int | None:
    """The rows of a ``save_to_disk`` folder, from its Arrow files (memory-mapped, not read into memory)."""
    import pyarrow as pa

    total = 0
    try:
        for file in sorted(folder.rglob("*.arrow")):
            with pa.memory_map(str(file)) as source:
                total += pa.ipc.open_stream(source).read_all().num_rows
    except (OSError, pa.ArrowException):
        return None
    return total
