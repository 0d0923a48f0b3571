"""Tokenisation and length-bucketed batching (docs/design.md, "Compute": no padding to max_length).

A split is tokenised once into flat id rows (:class:`Encoded`, :class:`Ragged`); batches are index arrays into it
(:class:`Batches`), each padded to its own longest row; torch is imported only in :func:`collate`.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch


def _spans(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + counts[i] - 1`` of every span, one span after the other."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    ends = np.cumsum(counts)
    return np.arange(total, dtype=np.int64) + np.repeat(np.asarray(starts, dtype=np.int64) - (ends - counts), counts)


class Ragged(Sequence):
    """Rows of integers of different lengths stored flat: row i is ``values[offsets[i]:offsets[i + 1]]`` (a view);
    :meth:`pad` gathers a batch of rows into one padded array."""

    __slots__ = ("values", "offsets")

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        self.values = values
        self.offsets = np.asarray(offsets, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i) -> np.ndarray:
        if isinstance(i, slice):
            raise TypeError("Ragged takes one row at a time; use take() for several")
        i = range(len(self))[i]  # (negative indices, and IndexError past the end)
        return self.values[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def pad(self, index: np.ndarray, fill: int, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The rows ``index`` as int64 [B, width] (default: their longest), ``fill`` past each end, and the mask."""
        index = np.asarray(index, dtype=np.int64)
        starts = self.offsets[index]
        lengths = self.offsets[index + 1] - starts
        width = int(lengths.max(initial=0)) if width is None else width
        columns = np.arange(width)
        mask = columns < lengths[:, None]
        source = starts[:, None] + columns
        np.minimum(source, max(len(self.values) - 1, 0), out=source)  # (past a row's end: any valid position)
        values = self.values[source].astype(np.int64) if len(self.values) else np.zeros(source.shape, np.int64)
        return np.where(mask, values, np.int64(fill)), mask


def _row_crcs(ids: Ragged, pairs: Ragged | None, chunk: int = 65536) -> np.ndarray:
    """zlib.crc32 of each row's ids followed by its pair's ids, both as int64 bytes."""
    out = np.zeros(len(ids), dtype=np.int64)
    for start in range(0, len(ids), chunk):
        stop = min(start + chunk, len(ids))
        sides = []
        for side in (ids, pairs) if pairs is not None else (ids,):
            off = side.offsets[start : stop + 1]
            data = side.values[off[0] : off[-1]].astype(np.int64).tobytes()
            sides.append((data, (8 * (off - off[0])).tolist()))
        for j in range(stop - start):
            crc = 0
            for data, bounds in sides:
                crc = zlib.crc32(data[bounds[j] : bounds[j + 1]], crc)
            out[start + j] = crc
    return out


@dataclass
class Encoded:
    """A tokenised split, in its row order: each row's truncated ids (a :class:`Ragged`), row_id and label."""

    input_ids: Ragged
    token_type_ids: Ragged | None
    row_ids: np.ndarray
    labels: np.ndarray | None
    pad_id: int
    pair_ids: Ragged | None = None  # the second text, tokenised on its own (``separate_pairs``)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        lengths = self.input_ids.lengths
        if self.pair_ids is not None:
            lengths += self.pair_ids.lengths
        return lengths

    @property
    def token_hashes(self) -> np.ndarray:
        """A CRC-32 of each row's token ids, which a feature dump keeps so a student can check it tokenises alike."""
        return _row_crcs(self.input_ids, self.pair_ids)


# Rows tokenised at a time: a fast tokenizer keeps an encoding object per row, many times its ids, so a whole split
# at once made memory grow with it (benchmarks/RESULTS.md, "How cost grows with the work").
TOKENIZE_CHUNK = 512

# How each field is stored: ids as int32 (every vocabulary fits), token types (0 or 1, a few at most) as int8
FIELD_DTYPES = {"input_ids": np.int32, "token_type_ids": np.int8}


class _Column:
    """One field of a split built a chunk of rows at a time into one array allocated up front (untouched pages take
    no memory), grown only when needed, so the ids are never held twice; ``dtype`` while the values fit, else int64."""

    def __init__(self, rows: int, capacity: int, dtype):
        self.values = np.empty(max(capacity, 1), dtype=dtype)
        self.offsets = np.zeros(rows + 1, dtype=np.int64)
        self.rows = self.used = 0

    def add(self, ids: list[list[int]]) -> None:
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        values = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        info = np.iinfo(self.values.dtype)
        if len(values) and (values.min() < info.min or values.max() > info.max):
            self.values = self.values.astype(np.int64)
        end = self.used + len(values)
        if end > len(self.values):
            grown = np.empty(max(end, 2 * len(self.values)), dtype=self.values.dtype)
            grown[: self.used] = self.values[: self.used]
            self.values = grown
        self.values[self.used : end] = values
        self.offsets[self.rows + 1 : self.rows + 1 + len(ids)] = self.used + np.cumsum(lengths)
        self.rows, self.used = self.rows + len(ids), end

    def ragged(self) -> Ragged:
        return Ragged(self.values[: self.used], self.offsets)


def _rows(texts, start: int, end: int) -> list:
    """Rows ``start:end`` of a list or a pandas column as a list."""
    return texts.iloc[start:end].tolist() if hasattr(texts, "iloc") else list(texts[start:end])


def _tokenized(tokenizer, texts, pairs, options: dict) -> dict[str, Ragged]:
    """The tokenizer's ``input_ids`` (and ``token_type_ids``) of every row, flat, TOKENIZE_CHUNK rows at a time."""
    columns: dict[str, _Column] = {}
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        end = start + TOKENIZE_CHUNK
        part = tokenizer(_rows(texts, start, end), _rows(pairs, start, end) if pairs is not None else None, **options)
        for field, dtype in FIELD_DTYPES.items():
            if part.get(field) is not None:
                if field not in columns:  # (room for every row at max_length, up to 2^28 values, grown past that)
                    capacity = min(len(texts) * options["max_length"], 1 << 28)
                    columns[field] = _Column(len(texts), capacity, dtype)
                columns[field].add(part[field])
    return {field: column.ragged() for field, column in columns.items()}


def encode(
    tokenizer, texts, text_pairs=None, *, max_length: int, row_ids=None, labels=None, separate_pairs: bool = False
) -> Encoded:
    """Tokenise without padding (``texts``, ``text_pairs``: lists or pandas columns). Pairs are one pair sequence,
    or with ``separate_pairs`` each side on its own, as the BiLSTM reads them (docs/methods.md §5)."""
    texts = texts if hasattr(texts, "iloc") else list(texts)
    pairs = None if text_pairs is None else text_pairs if hasattr(text_pairs, "iloc") else list(text_pairs)
    options = dict(truncation=True, max_length=max_length, padding=False, return_attention_mask=False)
    empty = Ragged(np.zeros(0, FIELD_DTYPES["input_ids"]), np.zeros(1, np.int64))
    pair_ids = types = None
    if separate_pairs:
        ids = _tokenized(tokenizer, texts, None, options).get("input_ids", empty)
        pair_ids = _tokenized(tokenizer, pairs, None, options).get("input_ids", empty) if pairs is not None else None
    else:
        out = _tokenized(tokenizer, texts, pairs, options)
        ids, types = out.get("input_ids", empty), out.get("token_type_ids")
    return Encoded(
        input_ids=ids,
        token_type_ids=types,
        row_ids=np.arange(len(ids), dtype=np.int64) if row_ids is None else np.asarray(row_ids, dtype=np.int64),
        labels=None if labels is None else np.asarray(labels, dtype=np.int64),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        pair_ids=pair_ids,
    )


class Batches(Sequence):
    """Batches of row indices in one array: batch i is ``rows[bounds[i]:bounds[i + 1]]`` (a view), so a pass holds
    two arrays, not one per batch; a slice (``batches[k::S]``, a shard's) or :meth:`take` gives a new Batches."""

    __slots__ = ("rows", "bounds")

    def __init__(self, rows: np.ndarray, bounds: np.ndarray):
        self.rows = np.asarray(rows, dtype=np.int64)
        self.bounds = np.asarray(bounds, dtype=np.int64)

    @classmethod
    def cut(cls, rows: np.ndarray, batch_size: int) -> Batches:
        """``rows`` cut into batches of ``batch_size`` (the last one shorter)."""
        bounds = np.append(np.arange(0, len(rows), batch_size, dtype=np.int64), len(rows))
        return cls(rows, bounds if len(rows) else np.zeros(1, np.int64))

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        i = range(len(self))[i]
        return self.rows[self.bounds[i] : self.bounds[i + 1]]

    def take(self, which: np.ndarray) -> Batches:
        """The batches ``which``, in that order."""
        which = np.asarray(which, dtype=np.int64)
        sizes = self.bounds[which + 1] - self.bounds[which]
        bounds = np.zeros(len(which) + 1, dtype=np.int64)
        np.cumsum(sizes, out=bounds[1:])
        return Batches(self.rows[_spans(self.bounds[which], sizes)], bounds)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.bounds)


def training_batches(lengths: np.ndarray, batch_size: int, *, seed: int, epoch: int, window: int = 50) -> Batches:
    """Shuffled, length-bucketed batches; the same (seed, epoch) always gives the same batches (for resume)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    span = batch_size * window
    for start in range(0, len(order), span):  # sorted by length inside each window, in place
        chunk = order[start : start + span]
        order[start : start + span] = chunk[np.argsort(lengths[chunk], kind="stable")]
    # each window is cut into batches on its own, so that no batch straddles two windows
    starts = [np.arange(s, min(s + span, len(order)), batch_size) for s in range(0, len(order), span)]
    batches = Batches(order, np.concatenate([*starts, [len(order)]]))
    return batches.take(rng.permutation(len(batches)))


def inference_batches(lengths: np.ndarray, batch_size: int) -> Batches:
    """All rows sorted by length (longest first, so running out of memory shows at once), in fixed batches."""
    return Batches.cut(np.argsort(-lengths, kind="stable"), batch_size)


# The unsharded pass: shard (k, S) runs every S-th batch from the k-th (kdpipe.signals.shards)
WHOLE = (0, 1)


def shard_batches(batches: Batches, shard: tuple[int, int]) -> Batches:
    """The batches shard ``(k, S)`` runs: every S-th batch from the k-th."""
    k, count = shard
    return batches[k::count]


def collate(encoded: Encoded, index: np.ndarray, device: torch.device | None = None) -> dict:
    """Pad the rows ``index`` to their longest length; returns model inputs plus ``index`` and ``labels`` (and
    ``pair_input_ids`` / ``pair_attention_mask``, padded apart, when the pairs were tokenised separately)."""
    import torch

    input_ids, mask = encoded.input_ids.pad(index, encoded.pad_id)
    batch = {"input_ids": input_ids, "attention_mask": mask.astype(np.int64)}
    if encoded.pair_ids is not None:
        pair_ids, pair_mask = encoded.pair_ids.pad(index, encoded.pad_id)
        batch["pair_input_ids"], batch["pair_attention_mask"] = pair_ids, pair_mask.astype(np.int64)
    if encoded.token_type_ids is not None:
        batch["token_type_ids"] = encoded.token_type_ids.pad(index, 0, input_ids.shape[1])[0]
    tensors = {k: torch.from_numpy(v) for k, v in batch.items()}
    tensors["index"] = torch.from_numpy(np.asarray(index, dtype=np.int64))
    if encoded.labels is not None:
        tensors["labels"] = torch.from_numpy(encoded.labels[index])
    if device is not None and device.type != "cpu":
        tensors = {k: v.pin_memory().to(device, non_blocking=True) for k, v in tensors.items()}
    return tensors


MODEL_INPUTS = ("input_ids", "attention_mask", "token_type_ids", "pair_input_ids", "pair_attention_mask")


def model_inputs(batch: dict) -> dict:
    """The keys of a collated batch that a Hugging Face model takes."""
    return {k: batch[k] for k in MODEL_INPUTS if k in batch}


def encode_frame(tokenizer, frame, *, max_length: int, label_ids=None, separate_pairs: bool = False) -> Encoded:
    """Tokenise a prepared split (columns ``text``, optional ``text_pair``; see ``kdpipe.data.prepare``)."""
    return encode(
        tokenizer,
        frame["text"],
        frame["text_pair"] if "text_pair" in frame.columns else None,
        max_length=max_length,
        row_ids=frame["row_id"].to_numpy(),
        labels=label_ids,
        separate_pairs=separate_pairs,
    )


def without_texts(frame):
    """A prepared split without its text columns: texts held for the whole job would make its memory grow with N."""
    return frame.drop(columns=[c for c in ("text", "text_pair") if c in frame.columns])
