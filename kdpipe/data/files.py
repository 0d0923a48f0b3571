"""Reading a local CSV/TSV/JSONL/Parquet file faithfully: every record of the file becomes one row, or the reader
says why not (docs/your-own-models-and-data.md, "Your own data", which gives each format's rules).
"""

from __future__ import annotations

import csv
import io
import json
import re
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa

from kdpipe.core.store import KdpipeError
from kdpipe.data.transfer_sources import file_not_found

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".parquet": "parquet"}
FORMATS = ("csv", "tsv", "jsonl", "parquet")


def read_table(
    path: str | Path, key: str, *, fmt: str, encoding: str, encoding_option: str = "dataset.encoding"
) -> pd.DataFrame:
    """Every column of a local file as read (text as strings), errors naming the file and the config ``key`` (an
    encoding error: the setting ``encoding_option``); ``frame.attrs["records"]`` says how the records map to rows."""
    path = Path(path)
    fmt = file_format(path, fmt)
    if not path.is_file():
        raise file_not_found(path, key)
    data = path.read_bytes()
    if not data.strip():
        raise KdpipeError(f"{path}: the file is empty")
    records: dict = {"file": str(path), "format": fmt}
    try:
        if fmt == "parquet":
            raw = pd.read_parquet(io.BytesIO(data))
        else:
            try:  # (a byte-order mark, as spreadsheet programs write it, would become part of the first header)
                text = data.decode(encoding).removeprefix("\ufeff")
            except (LookupError, UnicodeDecodeError) as err:
                raise encoding_error(path, encoding, err, data, encoding_option) from err
            del data  # (parsed from the text: one copy of the file less held, memory flat in N)
            raw = _read_jsonl(path, text, records) if fmt == "jsonl" else _read_delimited(path, text, records, fmt)
    except (ValueError, pa.ArrowException) as err:
        raise KdpipeError(f"{path}: cannot be read as {fmt} ({err})") from err
    if raw.empty:
        raise KdpipeError(f"{path}: no data rows")
    records["rows"] = len(raw)
    raw.attrs["records"] = records
    return raw


# A non-blank line between the line breaks of CSV and TSV readers (\r\n, \r, \n; not str.splitlines' others)
_FILLED_LINE = re.compile(r"[^\r\n]*\S[^\r\n]*")


def _read_delimited(path: Path, text: str, records: dict, fmt: str) -> pd.DataFrame:
    tsv = fmt == "tsv"
    # keep_default_na=False: words such as "NA" or "None" are text, not missing values; the text goes to pandas as
    # UTF-8 bytes (a StringIO would hold it as 4 bytes a character)
    options = {"sep": "\t", "quoting": csv.QUOTE_NONE} if tsv else {"sep": ","}
    raw = pd.read_csv(io.BytesIO(text.encode("utf-8")), dtype=str, keep_default_na=False, encoding="utf-8", **options)
    records["lines"] = sum(1 for _ in _FILLED_LINE.finditer(text)) - 1  # (counted without holding the lines)
    if tsv:
        if len(raw) != records["lines"]:
            raise KdpipeError(
                f"{path}: {records['lines']} data lines but {len(raw)} rows were read; each line of a TSV file must "
                "be one record (no quoting, no line breaks inside a field)"
            )
        return raw
    multiline = raw.apply(lambda column: column.str.contains("\n", regex=False)).any(axis=1)
    records["multiline_rows"] = int(multiline.sum())
    if records["multiline_rows"]:
        examples = "; ".join(f"row {i + 1}: {raw.iloc[i, 0][:60]!r}" for i in multiline.to_numpy().nonzero()[0][:3])
        print(
            f"[kdpipe] {path}: {records['multiline_rows']} of {len(raw)} rows span several lines (a quoted field "
            f"with line breaks; a stray opening quote looks the same), e.g. {examples}",
            file=sys.stderr,
        )
    return raw


def _read_jsonl(path: Path, text: str, records: dict) -> pd.DataFrame:
    rows = []
    # JSON Lines ends a record at "\n" only: str.splitlines would also split at U+2028, which JSON allows unescaped
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            rows.append(json_record(path, number, line))
    records["lines"] = len(rows)
    # every value as read: strings stay strings ("007"), numbers are made text by the column selection
    return pd.DataFrame.from_records(rows)


def json_record(path: Path, number: int, line: str) -> dict:
    """Line ``number`` of a JSONL file as the object of named fields it must be."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise KdpipeError(f"{path}: line {number} is not valid JSON ({err.msg} at column {err.colno})") from err
    if not isinstance(row, dict):
        raise KdpipeError(f"{path}: line {number} is a JSON {type(row).__name__}, not an object of named fields")
    return row


def file_format(path: Path, fmt: str | None) -> str:
    if fmt in (None, "auto"):
        if path.suffix.lower() not in EXTENSIONS:
            raise KdpipeError(
                f"{path}: cannot tell the format from the extension '{path.suffix}'; use one of "
                f"{', '.join(EXTENSIONS)} or set dataset.format to one of {', '.join(FORMATS)}"
            )
        return EXTENSIONS[path.suffix.lower()]
    if fmt not in FORMATS:  # (also for a stage run by hand, whose settings no schema checked)
        raise KdpipeError(f"dataset.format is '{fmt}'; expected auto or one of {', '.join(FORMATS)}")
    return fmt


def encoding_error(path: Path, encoding: str, err: Exception, data: bytes, option: str, offset: int = 0) -> KdpipeError:
    """The error of an unknown ``encoding`` (a LookupError) or of a file that does not decode in it, with the byte
    offset (``offset`` + the error's) and an encoding that works (:func:`encoding_hint` of ``data``, its start)."""
    if isinstance(err, LookupError):
        return KdpipeError(f"{option} '{encoding}' is not a known text encoding")
    return KdpipeError(
        f"{path}: not valid {encoding} at byte offset {offset + err.start} ({err.reason}); "
        f"{encoding_hint(data, option)}"
    )


def encoding_hint(data: bytes, option: str = "dataset.encoding") -> str:
    """The first candidate encoding that decodes the file (a byte-order mark decides UTF-16/32), as the setting
    ``option`` (a config key is set, a command-line option passed)."""
    use = f"pass {option} " if option.startswith("--") else f"set {option}: "
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return f"the file starts with a UTF-32 byte-order mark: {use}utf-32"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return f"the file starts with a UTF-16 byte-order mark: {use}utf-16"
    try:
        data.decode("utf-8")
        return f"it decodes as utf-8: {use}utf-8"
    except UnicodeDecodeError:
        pass
    # latin-1 decodes any bytes; Windows' cp1252 differs from it only on 0x80-0x9F (curly quotes, dashes, the euro)
    windows = any(0x80 <= byte <= 0x9F for byte in data)
    try:
        data.decode("cp1252")
    except UnicodeDecodeError:
        windows = False
    candidate = "cp1252" if windows else "latin-1"
    return f"it decodes as {candidate}: {use}{candidate} if that is its encoding"
