"""The texts of a user's unlabelled files, read in batches: a transfer source or an external OOD file.

:func:`text_readers` gives each part of a source (docs/your-own-models-and-data.md, "Unlabelled transfer data") as
(where, a function that yields its ``text`` and ``text_pair`` columns as strings in batches of :data:`BATCH_ROWS`),
so a caller can read a source twice without holding it. Bad input stops the read with one line naming the file. An
external OOD file: docs/methods.md, "Judging uncertainty".
"""

from __future__ import annotations

import codecs
import functools
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.store import KdpipeError
from kdpipe.data.files import encoding_error, file_format, json_record
from kdpipe.data.hf import is_hf_source, load_splits
from kdpipe.data.labels import container
from kdpipe.data.settings import OodSourceSettings, TransferSettings
from kdpipe.data.transfer_sources import file_not_found, no_column

BATCH_ROWS = 65_536


def text_readers(
    source: str, key: str, settings: TransferSettings | OodSourceSettings
) -> list[tuple[str, Callable[[], Iterator[pd.DataFrame]]]]:
    """Each part of ``source`` as (where, reader) of the ``settings``' text column(s); ``key``: the config key."""
    wanted, section = {"text": settings.text_column}, key.rpartition(".")[0]  # (section: its keys name the columns)
    if settings.text_pair_column:
        wanted["text_pair"] = settings.text_pair_column
    if is_hf_source(source):
        splits = load_splits(source, key)
        readers = [
            (f"{source} ({name} split)", _hf_reader(data, wanted, section, f"{key} {source}", name))
            for name, data in splits.items()
        ]
    else:
        readers = [(source, _file_reader(Path(source), settings.format, settings.encoding, wanted, section, key))]
    return [(where, functools.partial(_as_text, reader, wanted, where)) for where, reader in readers]


def _file_reader(
    path: Path, fmt: str, encoding: str, wanted: dict[str, str], section: str, key: str
) -> Callable[[], Iterator[pd.DataFrame]]:
    if not path.is_file():
        raise file_not_found(path, key)
    if not path.stat().st_size or not _has_content(path):
        raise KdpipeError(f"{path}: the file is empty ({key})")
    fmt = file_format(path, fmt)
    if fmt != "parquet":
        _check_encoding(path, encoding, key)
    reader = {"parquet": _parquet_reader, "jsonl": _jsonl_reader}.get(fmt, _delimited_reader)
    return reader(path, wanted, section, fmt, encoding)


_KEYS = {"text": "text_column", "text_pair": "text_pair_column"}


def _check_columns(where: str, available: list[str], wanted: dict[str, str], section: str) -> None:
    for name, column in wanted.items():
        if column not in available:
            raise no_column(where, column, f"{section}.{_KEYS[name]}", available)


def _as_text(reader, wanted: dict[str, str], where: str) -> Iterator[pd.DataFrame]:
    """The wanted columns of each batch ``reader()`` yields, under kdpipe's names, as strings (None where missing);
    a list, an object or bytes in a cell stops the read, naming the row."""
    start = 0
    for frame in reader():
        out = {}
        for name, column in wanted.items():
            values = frame[column]
            if values.dtype != object:
                values = values.astype(object).where(values.notna(), None)
            kinds = values.map(_not_text)
            bad = np.flatnonzero(kinds.notna().to_numpy())
            if len(bad):
                raise KdpipeError(
                    f"{where}: data row {start + bad[0] + 1} (counting from 1) has {kinds.iloc[bad[0]]} in column "
                    f"'{column}' (dataset.{_KEYS[name]}); a text must be a single value (a string or a number)"
                )
            out[name] = values.map(lambda v: v if v is None or isinstance(v, str) else str(v))
        start += len(frame)
        yield pd.DataFrame(out)


def _not_text(value) -> str | None:
    return container(value) or ("bytes (a binary column)" if isinstance(value, (bytes, bytearray)) else None)


def _parquet_reader(path: Path, wanted: dict[str, str], section: str, fmt: str, encoding: str):
    def read() -> Iterator[pd.DataFrame]:
        try:
            file = pq.ParquetFile(path, pre_buffer=False)  # (pre-buffered row groups stay held: memory would grow)
        except (pa.ArrowException, OSError) as err:
            raise KdpipeError(f"{path}: cannot be read as parquet ({err})") from err
        _check_columns(str(path), file.schema_arrow.names, wanted, section)
        for batch in file.iter_batches(BATCH_ROWS, columns=list(wanted.values())):
            yield batch.to_pandas()

    return read


# Arrow's CSV block size (every record must fit one), and the most it grows to for a larger record
CSV_BLOCK, CSV_BLOCK_MAX = 1 << 22, (1 << 31) - 1


def _delimited_reader(path: Path, wanted: dict[str, str], section: str, fmt: str, encoding: str):
    import pyarrow.csv as csv

    tsv = fmt == "tsv"
    parse = csv.ParseOptions(
        delimiter="\t" if tsv else ",", quote_char=False if tsv else '"', newlines_in_values=not tsv
    )
    convert = csv.ConvertOptions(
        include_columns=list(wanted.values()),
        column_types={column: pa.string() for column in wanted.values()},
        strings_can_be_null=False,
    )

    def read() -> Iterator[pd.DataFrame]:
        block, done = CSV_BLOCK, 0
        while True:  # (again with larger blocks, past the rows already given, when a record does not fit one)
            options = dict(read_options=csv.ReadOptions(encoding=encoding, block_size=block), parse_options=parse)
            try:
                _check_columns(str(path), csv.open_csv(path, **options).schema.names, wanted, section)
                skip = done
                for batch in csv.open_csv(path, **options, convert_options=convert):
                    if skip >= len(batch):
                        skip -= len(batch)
                        continue
                    batch, skip = batch.slice(skip), 0
                    done += len(batch)
                    yield batch.to_pandas()
                return
            except pa.ArrowInvalid as err:
                if "straddl" in str(err) and block < min(path.stat().st_size + 1, CSV_BLOCK_MAX):
                    block = min(4 * block, path.stat().st_size + 1, CSV_BLOCK_MAX)
                    continue
                raise KdpipeError(f"{path}: cannot be read as {fmt} ({err})") from err

    return read


def _jsonl_reader(path: Path, wanted: dict[str, str], section: str, fmt: str, encoding: str):
    def read() -> Iterator[pd.DataFrame]:
        rows, seen = [], set()
        with open(path, encoding=encoding, newline="") as handle:
            # JSON Lines ends a record at "\n" only (a text may hold U+2028); see kdpipe.data.files
            for number, line in enumerate(_lines(handle), start=1):
                if number == 1:
                    line = line.removeprefix("\ufeff")  # a byte-order mark, as spreadsheet programs write it
                if not line.strip():
                    continue
                row = json_record(path, number, line)
                seen.update(row)
                rows.append({column: row.get(column) for column in wanted.values()})
                if len(rows) == BATCH_ROWS:
                    _check_columns(str(path), sorted(seen), wanted, section)
                    yield pd.DataFrame(rows, columns=list(wanted.values()))
                    rows = []
        if rows:
            _check_columns(str(path), sorted(seen), wanted, section)
            yield pd.DataFrame(rows, columns=list(wanted.values()))

    return read


def _lines(handle) -> Iterator[str]:
    """Lines ended by "\\n" only, read in chunks (``for line in file`` would also split at U+2028)."""
    rest = ""
    while chunk := handle.read(1 << 20):
        parts = (rest + chunk).split("\n")
        rest = parts.pop()
        yield from parts
    if rest:
        yield rest


def _hf_reader(data, wanted: dict[str, str], section: str, source: str, split: str):
    def read() -> Iterator[pd.DataFrame]:
        _check_columns(f"{source} ({split} split)", list(data.column_names), wanted, section)
        for start in range(0, len(data), BATCH_ROWS):
            batch = data.select_columns(list(wanted.values()))[start : start + BATCH_ROWS]
            yield pd.DataFrame(batch)

    return read


def _has_content(path: Path) -> bool:
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            if chunk.strip():
                return True
    return False


def _check_encoding(path: Path, encoding: str, key: str) -> None:
    """The whole file decodes in ``encoding`` (read in chunks), or :func:`kdpipe.data.files.encoding_error`."""
    try:
        decoder = codecs.getincrementaldecoder(encoding)()
    except LookupError as err:
        raise encoding_error(path, encoding, err, b"", "dataset.encoding") from err
    offset = 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(1 << 22)
            pending = len(decoder.getstate()[0])  # bytes of an unfinished character, decoded with this chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                handle.seek(0)
                said = encoding_error(path, encoding, err, handle.read(1 << 24), "dataset.encoding", offset - pending)
                raise KdpipeError(f"{said} ({key})") from err
            if not chunk:
                return
            offset += len(chunk)
