"""Unlabelled transfer text (docs/your-own-models-and-data.md, "Unlabelled transfer data"): rows that teachers
label and students learn from, never evaluated, with no gold label.

Transfer rows come from ``dataset.transfer`` (a file, a list of per-part files, ``hf:NAME[:CONFIG]`` or a
``save_to_disk`` folder; only the text column, and the text pair column when configured, are read: a label column
is ignored) and from the training rows whose labels ``dataset.split.unlabelled`` withholds (the prepare stage writes
their texts to ``unlabelled.parquet``). The ``transfer`` stage writes them as a one-split dataset artifact,
``results/transfer/<dataset>/`` (``transfer.parquet``, ``labels.json``, ``manifest.json``), so that teacher signal
passes read it like any split.

Rows are read in batches and written in batches, in two passes over the sources, so memory is flat in N beyond
an 8-byte hash per row (no text is held): pass 1 hashes every text, pass 2 writes the rows kept. Dropped, and
counted in the manifest (``dropped``) and the log:
- an empty or missing text (``empty``);
- a text that repeats an earlier transfer row (``duplicate``);
- a text equal to a validation, test or OOD text (``evaluation``; the OOD rows of held-out classes,
  ``evaluate.ood.classes``): a teacher's view of it would leak into the student;
- a text equal to a labelled training text (``labelled``): that row is already in the student's data with its label;
- rows beyond ``dataset.transfer_max_rows`` (``over_max_rows``), a seeded random choice.
Texts are compared by a 64-bit hash of (text, text pair), folded as an uncased tokenizer reads them (:func:`_hashes`).
Every kept row gets a ``row_id`` after the dataset's
largest (the withheld training rows keep theirs) and ``draw``, its rank in a seeded random order: a student that
reads a fraction f of the transfer rows (``students.<name>.transfer``) takes the rows with ``draw < round(f·N)``,
so a smaller fraction's rows are part of every larger one's.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kdpipe.core.checksums import verify, write_manifest
from kdpipe.core.store import KdpipeError, atomic_path, make_manifest, read_manifest, write_json
from kdpipe.data.dataset import OOD, SPLITS, TRANSFER, read_labels, read_split
from kdpipe.data.files import encoding_hint, file_format
from kdpipe.data.hf import is_hf_source, load_splits
from kdpipe.data.prepare import UNLABELLED
from kdpipe.data.transfer_sources import transfer_sources

BATCH_ROWS = 65_536
_REASONS = ("empty", "duplicate", "evaluation", "labelled", "over_max_rows")
WITHHELD = "the withheld training rows (dataset.split.unlabelled)"


def build_transfer(params: dict, data_dir: Path, out_dir: Path) -> dict:
    """Write the transfer artifact of the ``dataset`` slice ``params`` beside the prepared dataset ``data_dir``;
    return its manifest."""
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    columns = ["text", *(["text_pair"] if params.get("text_pair_column") else [])]
    # the withheld training rows first: they keep their row_ids, smaller than the ids given after them
    readers = []
    unlabelled = data_dir / UNLABELLED
    if unlabelled.is_file():
        manifest = read_manifest(data_dir / "manifest.json", kind="dataset")
        verify(manifest, data_dir / "manifest.json", [UNLABELLED], target=data_dir)
        readers.append((WITHHELD, lambda: _parquet_batches(unlabelled, columns)))
    readers += [(where, reader) for source in transfer_sources(params) for where, reader in _readers(source, params)]
    if not readers:
        raise KdpipeError("dataset.transfer is not set and dataset.split.unlabelled is 0: there are no transfer rows")
    rng = np.random.default_rng([int((params.get("split") or {}).get("seed", 13)), 7])
    reason, hashed, counts = _reasons(readers, data_dir, columns, params.get("transfer_max_rows"), rng)
    dropped = {name: int((reason == code).sum()) for code, name in enumerate(_REASONS, start=1)}
    kept = int((reason == 0).sum())
    if not kept:
        raise KdpipeError(f"dataset.transfer: no row is left of {len(reason):,} read ({_dropped_text(dropped)})")
    draw = np.empty(kept, np.int64)
    draw[rng.permutation(kept)] = np.arange(kept)
    first_id = _next_row_id(data_dir)
    manifest = write_one_split(
        out_dir,
        TRANSFER,
        lambda path: _write(path, readers, reason, hashed, draw, first_id, columns),
        params,
        data_dir,
        kept,
        read=counts["rows"],
        multiline_texts=counts["multiline_texts"],
        dropped=dropped,
    )
    print(f"[kdpipe] transfer: {kept:,} rows kept of {len(reason):,} read ({_dropped_text(dropped)})", file=sys.stderr)
    return manifest


def write_one_split(out_dir: Path, split: str, write_rows, params: dict, data_dir: Path, rows: int, **fields) -> dict:
    """A one-split dataset artifact beside the prepared dataset ``data_dir`` (the transfer rows, an external OOD
    set): ``write_rows(path)`` writes ``{split}.parquet``; then its labels (the dataset's) and manifest, all at once
    (atomically). Returns the manifest."""
    labels = read_labels(data_dir)
    with atomic_path(out_dir, directory=True) as tmp:
        write_rows(tmp / f"{split}.parquet")
        write_json(tmp / "labels.json", labels)
        manifest = make_manifest(
            "dataset", config=params, name=params.get("name", "bbc_news"), labels=labels, rows={split: rows}, **fields
        )
        return write_manifest(tmp / "manifest.json", manifest, [f"{split}.parquet", "labels.json"])


def _reasons(readers, data_dir: Path, columns: list[str], cap: int | None, rng) -> tuple[np.ndarray, np.ndarray, dict]:
    """Pass 1: why each row read is dropped (a code, 1-based in ``_REASONS``; 0: kept), each row's hash, and what
    was read (rows per source, texts spanning several lines)."""
    held = {split: _hashes(read_split(data_dir, split), columns) for split in SPLITS}
    if (data_dir / f"{OOD}.parquet").is_file():  # the held-out classes' test rows are evaluated too
        held["test"] = np.union1d(held["test"], _hashes(read_split(data_dir, OOD), columns))
    hashes, reasons, counts, multiline = [], [], {}, {}
    for where, reader in readers:
        read = lines = 0
        for batch in reader():
            hashes.append(_hashes(batch, columns))
            reasons.append(np.where(_empty(batch, columns), 1, 0).astype(np.int8))
            lines += int(batch["text"].str.contains("\n", regex=False).sum())
            read += len(batch)
        if not read:
            raise KdpipeError(f"{where}: no data rows (dataset.transfer)")
        key, copy = where, 1
        while key in counts:  # the same source listed twice
            copy += 1
            key = f"{where} (listed {copy} times)"
        counts[key] = read
        if lines and where != WITHHELD:  # (the dataset's own texts: their paragraphs were checked by prepare)
            # as a stray opening quote in a CSV file also makes them (kdpipe.data.files)
            multiline[key] = lines
            print(f"[kdpipe] transfer: {where}: {lines:,} of {read:,} texts span several lines", file=sys.stderr)
    counts = {"rows": counts, "multiline_texts": multiline}
    hashed, reason = np.concatenate(hashes), np.concatenate(reasons)
    first = np.zeros(len(hashed), bool)
    first[np.unique(hashed, return_index=True)[1]] = True
    reason[(reason == 0) & ~first] = 2
    reason[(reason == 0) & np.isin(hashed, np.union1d(held["validation"], held["test"]))] = 3
    reason[(reason == 0) & np.isin(hashed, held["train"])] = 4
    kept = np.flatnonzero(reason == 0)
    if cap is not None and len(kept) > cap:
        reason[np.sort(rng.choice(kept, len(kept) - cap, replace=False))] = 5
    return reason, hashed, counts


def _write(path: Path, readers, reason: np.ndarray, hashed: np.ndarray, draw: np.ndarray, first_id: int, columns):
    """Pass 2: the kept rows, numbered after the dataset's largest row_id (a withheld training row keeps its own).
    Every batch must hash as in pass 1: a file changed between the passes stops the job (nothing is written)."""
    writer, position, written, numbered = None, 0, 0, 0
    for where, reader in readers:
        for batch in reader():
            if not np.array_equal(_hashes(batch, columns), hashed[position : position + len(batch)]):
                raise KdpipeError(f"{where}: changed while the transfer job read it; run the job again")
            keep = reason[position : position + len(batch)] == 0
            position += len(batch)
            if not keep.any():
                continue
            rows = batch.loc[keep, columns].reset_index(drop=True)
            if "row_id" in batch:
                ids = batch.loc[keep, "row_id"].to_numpy(np.int64)
            else:
                ids = first_id + np.arange(numbered, numbered + len(rows), dtype=np.int64)
                numbered += len(rows)
            rows.insert(0, "row_id", ids)
            rows["draw"] = draw[written : written + len(rows)]
            written += len(rows)
            table = pa.Table.from_pandas(rows, preserve_index=False)
            writer = writer or pq.ParquetWriter(path, table.schema)
            writer.write_table(table)
    if position != len(reason):
        raise KdpipeError(f"{where}: changed while the transfer job read it; run the job again")
    writer.close()


def transfer_rows(frame: pd.DataFrame, fraction: float) -> pd.DataFrame:
    """The rows of a transfer split that a student reading ``fraction`` of it takes (``draw < round(f·N)``)."""
    take = int(np.floor(fraction * len(frame) + 0.5))
    return frame[frame["draw"].to_numpy() < take].reset_index(drop=True)


def _dropped_text(dropped: dict) -> str:
    parts = {
        "empty": "empty text",
        "duplicate": "repeated transfer text",
        "evaluation": "equal to a validation, test or OOD text",
        "labelled": "equal to a labelled training text",
        "over_max_rows": "over dataset.transfer_max_rows",
    }
    return ", ".join(f"{dropped[k]:,} dropped as {v}" for k, v in parts.items() if dropped[k]) or "none dropped"


def _next_row_id(data_dir: Path) -> int:
    """One more than the largest row_id of the dataset (every split and the withheld rows)."""
    largest = -1
    for name in [*(f"{split}.parquet" for split in SPLITS), UNLABELLED]:
        path = data_dir / name
        if path.is_file():
            column = pq.read_table(path, columns=["row_id"]).column(0)
            if len(column):
                largest = max(largest, int(pa.compute.max(column).as_py()))
    if largest >= np.iinfo(np.int64).max - 10**12:
        raise KdpipeError("dataset.id_column: the ids leave no room to number the transfer rows after them")
    return largest + 1


# What the comparison of texts ignores beside white space: accents and other combining marks (after NFKD; the common
# blocks) and invisible format characters (soft hyphen, zero-width spaces and joiners, direction marks, BOM)
_IGNORED = (
    r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
    r"\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]"
)


def _hashes(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """A 64-bit hash of each row's (text, text pair), each folded the way an uncased tokenizer reads it: Unicode
    compatibility forms (NFKD), accents and invisible characters removed (:data:`_IGNORED`), case folded, white
    space collapsed to one space and trimmed. A copy of a test text in capitals, without its accents, with a
    zero-width space, a trailing space or Windows line breaks is the same text to an uncased tokenizer (the builtin
    MiniLM's), so it leaks all the same."""
    normal = {
        column: frame[column]
        .fillna("")
        .astype(str)
        .str.normalize("NFKD")
        .str.replace(_IGNORED, "", regex=True)
        .str.casefold()
        .str.replace(r"\s+", " ", regex=True)
        .str.strip()
        for column in columns
    }
    return pd.util.hash_pandas_object(pd.DataFrame(normal), index=False).to_numpy(np.uint64)


def _empty(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    empty = np.zeros(len(frame), bool)
    for column in columns:
        values = frame[column]
        empty |= values.isna().to_numpy() | (values.astype(str).str.strip() == "").to_numpy()
    return empty


# ---- readers: each source as (where, a function that yields its rows in batches as text columns)


def _readers(
    source: str, params: dict, key: str = "dataset.transfer"
) -> list[tuple[str, Callable[[], Iterator[pd.DataFrame]]]]:
    """Each part of ``source`` as (where, reader); ``key`` names the config key in messages."""
    wanted = {"text": params.get("text_column", "text")}
    if params.get("text_pair_column"):
        wanted["text_pair"] = params["text_pair_column"]
    if is_hf_source(source):
        splits = load_splits(source, key)
        readers = [
            (f"{source} ({name} split)", _hf_reader(data, wanted, source, name)) for name, data in splits.items()
        ]
    else:
        readers = [(source, _file_reader(Path(source), params, wanted, key))]
    return [(where, _texts_of(reader, wanted, where)) for where, reader in readers]


def _texts_of(reader, wanted: dict[str, str], where: str) -> Callable[[], Iterator[pd.DataFrame]]:
    return lambda: _as_text(reader(), wanted, where)


def _file_reader(path: Path, params: dict, wanted: dict[str, str], key: str) -> Callable[[], Iterator[pd.DataFrame]]:
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise KdpipeError(f"{path}: file not found{where}; check {key}")
    if not path.stat().st_size or not _has_content(path):
        raise KdpipeError(f"{path}: the file is empty ({key})")
    fmt = file_format(path, params.get("format", "auto"))
    encoding = params.get("encoding", "utf-8")
    if fmt != "parquet":
        _check_encoding(path, encoding, key)
    reader = {"parquet": _parquet_reader, "jsonl": _jsonl_reader}.get(fmt, _delimited_reader)
    return reader(path, wanted, fmt, encoding)


def _missing(where: str, column: str, key: str, available: list[str]) -> KdpipeError:
    import difflib

    close = difflib.get_close_matches(column, available, n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return KdpipeError(f"{where}: no column '{column}' (dataset.{key}); the columns are {available}{hint}")


_KEYS = {"text": "text_column", "text_pair": "text_pair_column"}


def _check_columns(where: str, available: list[str], wanted: dict[str, str]) -> None:
    for name, column in wanted.items():
        if column not in available:
            raise _missing(where, column, _KEYS[name], available)


def _as_text(batches: Iterator[pd.DataFrame], wanted: dict[str, str], where: str) -> Iterator[pd.DataFrame]:
    """The wanted columns of each batch under kdpipe's names, as strings (None where missing); numbers become their
    text. A list, an object or bytes in a cell stops the read, naming the row (as the labelled data's reader does)."""
    start = 0
    for frame in batches:
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
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, (list, tuple, set, np.ndarray)):
        return "a list"
    if isinstance(value, (bytes, bytearray)):
        return "bytes (a binary column)"
    return None


def _parquet_batches(path: Path, columns: list[str]) -> Iterator[pd.DataFrame]:
    """The withheld training rows (already validated by the prepare stage), with their row_ids."""
    for batch in pq.ParquetFile(path).iter_batches(BATCH_ROWS, columns=["row_id", *columns]):
        yield batch.to_pandas()


def _parquet_reader(path: Path, wanted: dict[str, str], fmt: str, encoding: str):
    def read() -> Iterator[pd.DataFrame]:
        try:
            file = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as err:
            raise KdpipeError(f"{path}: cannot be read as parquet ({err})") from err
        _check_columns(str(path), file.schema_arrow.names, wanted)
        for batch in file.iter_batches(BATCH_ROWS, columns=list(wanted.values())):
            yield batch.to_pandas()

    return read


# Arrow's CSV reader parses a file in blocks and needs every record inside one: the first block size, and the most
# it grows to when a record is larger (a whole long document in one cell)
CSV_BLOCK, CSV_BLOCK_MAX = 1 << 22, (1 << 31) - 1


def _delimited_reader(path: Path, wanted: dict[str, str], fmt: str, encoding: str):
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
                _check_columns(str(path), csv.open_csv(path, **options).schema.names, wanted)
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


def _jsonl_reader(path: Path, wanted: dict[str, str], fmt: str, encoding: str):
    def read() -> Iterator[pd.DataFrame]:
        rows, seen = [], set()
        with open(path, encoding=encoding, newline="") as handle:
            # JSON Lines ends a record at "\n" only (a text may hold U+2028); see kdpipe.data.files
            for number, line in enumerate(_lines(handle), start=1):
                if number == 1:
                    line = line.removeprefix("\ufeff")  # a byte-order mark, as spreadsheet programs write it
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise KdpipeError(
                        f"{path}: line {number} is not valid JSON ({err.msg} at column {err.colno})"
                    ) from err
                if not isinstance(row, dict):
                    raise KdpipeError(
                        f"{path}: line {number} is a JSON {type(row).__name__}, not an object of named fields"
                    )
                seen.update(row)
                rows.append({column: row.get(column) for column in wanted.values()})
                if len(rows) == BATCH_ROWS:
                    _check_columns(str(path), sorted(seen), wanted)
                    yield pd.DataFrame(rows, columns=list(wanted.values()))
                    rows = []
        if rows:
            _check_columns(str(path), sorted(seen), wanted)
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


def _hf_reader(data, wanted: dict[str, str], source: str, split: str):
    def read() -> Iterator[pd.DataFrame]:
        _check_columns(f"dataset.transfer {source} ({split} split)", list(data.column_names), wanted)
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
    """The whole file decodes in ``encoding`` (read in chunks), or an error with the byte offset and a hint."""
    try:
        decoder = codecs.getincrementaldecoder(encoding)()
    except LookupError as err:
        raise KdpipeError(f"dataset.encoding '{encoding}' is not a known text encoding") from err
    offset = 0
    with open(path, "rb") as handle:
        while True:
            chunk = handle.read(1 << 22)
            pending = len(decoder.getstate()[0])  # bytes of an unfinished character, decoded with this chunk
            try:
                decoder.decode(chunk, final=not chunk)
            except UnicodeDecodeError as err:
                start = offset - pending + err.start
                handle.seek(0)
                raise KdpipeError(
                    f"{path}: not valid {encoding} at byte offset {start} ({err.reason}); "
                    f"{encoding_hint(handle.read(1 << 24))} ({key})"
                ) from err
            if not chunk:
                return
            offset += len(chunk)
