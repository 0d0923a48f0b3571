"""Evaluation texts inside longer texts (docs/your-own-models-and-data.md, "Evaluation texts inside other texts"):
the rule by which the transfer rows (kdpipe.data.transfer) and an external OOD set (kdpipe.data.ood) lose a row that
holds a validation, test or held-out class's text anywhere in it, behind a source line, inside a quotation, before
a credit line.

The evaluation n-grams are hashed once (:class:`EvaluationNgrams`); rows are tested in numpy and Arrow with no Python
loop over rows or words, :data:`CHUNK_CHARS` folded characters at a time, so memory stays bounded. A row is caught
by mistake only through a 64-bit hash collision: for 10^9 windows against 10^6 n-grams, about 1 in 20,000.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from kdpipe.data.folding import CJK

NGRAM = 13  # words: an evaluation text shares a sequence this long with a row, or (if shorter) lies whole in it
CHUNK_CHARS = 1 << 23  # folded characters split into words at once (about 1.5 million English words)
SHARED, CONTAINED = 1, 2  # what :meth:`EvaluationNgrams.find` says of a row (0: neither)

_BASE = 0x9E3779B97F4A7C15  # the multiplier of the polynomial hash of a window (odd: invertible modulo 2**64)
_LENGTH = 0xC2B2AE3D27D4EB4F  # added k times to a window of k words, so windows of other lengths do not meet
_SEPARATORS = r"[^\p{L}\p{N}]+"  # (RE2) what cuts a folded text into words
_IDEOGRAPH = "([" + "".join(f"\\x{{{first:x}}}-\\x{{{last:x}}}" for first, last in CJK) + "])"


def joined(folded: dict[str, pd.Series]) -> pd.Series:
    """Each row's folded text and text pair as one text, so a copy split between the two is consecutive words."""
    first, *others = folded.values()
    return first.str.cat(others, sep=" ") if others else first


def _chunks(texts: pd.Series) -> Iterator[pd.Series]:
    """``texts`` in consecutive slices of about :data:`CHUNK_CHARS` characters (at least one text each)."""
    ends = np.cumsum(texts.str.len().to_numpy(np.int64))
    start = 0
    while start < len(texts):
        stop = int(np.searchsorted(ends, (ends[start - 1] if start else 0) + CHUNK_CHARS, side="right"))
        stop = max(stop, start + 1)
        yield texts.iloc[start:stop]
        start = stop


def word_hashes(texts: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """The 64-bit hash of every word of the folded ``texts``, one text after another, and each text's word count."""
    array = pa.array(texts.to_numpy(dtype=object), pa.large_string())
    if pc.any(pc.match_substring_regex(array, _IDEOGRAPH)).as_py():
        array = pc.replace_substring_regex(array, _IDEOGRAPH, r" \1 ")
    parts = pc.split_pattern_regex(array, _SEPARATORS)
    flat, parent = pc.list_flatten(parts), pc.list_parent_indices(parts)
    nonempty = pc.not_equal(flat, "")  # (a text that begins or ends with a separator gives an empty first/last part)
    flat, parent = pc.filter(flat, nonempty), pc.filter(parent, nonempty).to_numpy()
    counts = np.bincount(parent, minlength=len(texts)).astype(np.int64)
    if not len(flat):
        return np.zeros(0, np.uint64), counts
    encoded = flat.dictionary_encode()
    distinct = pd.util.hash_array(encoded.dictionary.to_numpy(zero_copy_only=False))
    return distinct[encoded.indices.to_numpy()].astype(np.uint64, copy=False), counts


def windows(words: np.ndarray, lengths: Iterable[int]) -> Iterator[tuple[int, np.ndarray]]:
    """For each k of ``lengths`` (ascending), k and the hash (Σ_j w_j·B^(k-1-j) + k·L) mod 2^64 of the k words starting
    at each position of ``words``, grown one word at a time (Horner's rule); windows that cross texts are the caller's
    to mask."""
    wanted = sorted(set(lengths))
    current = words.copy()
    for k in range(1, (wanted[-1] if wanted else 0) + 1):
        if k > 1:
            current = current[:-1]
            current *= np.uint64(_BASE)
            current += words[k - 1 :]
        if k in wanted:
            yield k, current + np.uint64((k * _LENGTH) % (1 << 64))


class EvaluationNgrams:
    """The n-grams of the evaluation texts (folded and :func:`joined`, in any number of parts), hashed once, and
    :meth:`find`, which tests rows against them; a text shorter than ``n`` words gives itself whole, one without a
    word nothing (the equality of whole texts covers it)."""

    def __init__(self, texts: Iterable[pd.Series], n: int = NGRAM):
        self.n = n
        found, lengths = [], set()
        self.texts = self.short_texts = 0
        for part in texts:
            for chunk in _chunks(part):
                words, counts = word_hashes(chunk)
                starts, room = _layout(counts)
                short = (counts > 0) & (counts < n)
                self.texts += int((counts > 0).sum())
                self.short_texts += int(short.sum())
                wanted = {int(k) for k in np.unique(counts[short])} | ({n} if (counts >= n).any() else set())
                lengths |= wanted
                for k, hashed in windows(words, wanted):
                    if k == n:  # every window of n words inside a text (of n words or more)
                        found.append(hashed[room[: len(hashed)] >= n])
                    whole = starts[counts == k]  # the texts of exactly k words, whole
                    found.append(hashed[whole])
        self.lengths = sorted(lengths)
        self.hashes = np.unique(np.concatenate(found)) if found else np.zeros(0, np.uint64)
        # a table of the hashes' leading bits (at most 64 MB): about 1 in 16 misses goes on to the binary search
        self.bits = int(min(26, max(10, np.ceil(np.log2(len(self.hashes) + 1)) + 4)))
        self.table = np.zeros(1 << self.bits, bool)
        self.table[self.hashes >> np.uint64(64 - self.bits)] = True

    def describe(self) -> dict:
        """The rule and what it was built from, for a manifest."""
        return {
            "ngram_words": self.n,
            "shared_ngrams": 1,
            "evaluation_texts": self.texts,
            "short_evaluation_texts": self.short_texts,
        }

    def _member(self, hashed: np.ndarray) -> np.ndarray:
        """The positions of ``hashed`` that are evaluation hashes."""
        candidates = np.flatnonzero(self.table[hashed >> np.uint64(64 - self.bits)])
        if not len(candidates):
            return candidates
        values = hashed[candidates]
        at = np.minimum(np.searchsorted(self.hashes, values), len(self.hashes) - 1)
        return candidates[self.hashes[at] == values]

    def find(self, texts: pd.Series) -> np.ndarray:
        """For each folded, joined row of ``texts``: :data:`SHARED`, :data:`CONTAINED` or 0."""
        out = np.zeros(len(texts), np.int8)
        if not self.lengths or not len(texts):
            return out
        done = 0
        for chunk in _chunks(texts):
            words, counts = word_hashes(chunk)
            ends = np.cumsum(counts)
            _, room = _layout(counts)
            code = out[done : done + len(chunk)]
            for k, hashed in windows(words, [k for k in self.lengths if k <= len(words)]):
                hit = self._member(hashed)
                hit = hit[room[hit] >= k]  # (a window that runs on into the next row is no window of a row)
                rows = np.searchsorted(ends, hit, side="right")
                code[rows] = SHARED if k == self.n else np.where(code[rows] == SHARED, SHARED, CONTAINED)
            done += len(chunk)
        return out


def _layout(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each text's words start in the flat word array, and how many words of its text each word begins."""
    ends = np.cumsum(counts)
    starts = ends - counts
    room = (np.repeat(ends, counts) - np.arange(int(ends[-1]) if len(ends) else 0)).astype(np.int32)
    return starts, room
