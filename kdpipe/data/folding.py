"""Texts compared as a model reads them (docs/your-own-models-and-data.md, "When two texts are the same"): one folding
for prepare's duplicate and conflict checks (kdpipe.data.prepare, kdpipe.data.conflicts) and for the leak filters of
the transfer rows and an external OOD set (kdpipe.data.transfer, kdpipe.data.ood), whole texts and the words of
evaluation texts inside other texts alike (kdpipe.data.contamination).

A text is folded the way an uncased (BERT-style WordPiece) tokenizer reads it (:func:`fold`: entities decoded,
quotes made plain, NFKD, case folded, :data:`IGNORED` characters removed, white space collapsed and dropped next to
punctuation or a CJK ideograph); :func:`copy_prefix` bounds what a model sees of a long text.
"""

from __future__ import annotations

import functools
import html
import sys
import unicodedata

import numpy as np
import pandas as pd

# What the comparison of texts ignores beside white space: combining marks (after NFKD), the control characters BERT's
# tokenizer deletes, U+FFFD, and format characters (:func:`ignored` adds every other one of Unicode category Cf)
IGNORED = (
    r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
    r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ufffd"
    r"\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]"
)
# Typographic quotes and apostrophes as the plain ones (NFKD leaves them): single, then double
QUOTES = str.maketrans(dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2035\u02bc", "'") | dict.fromkeys(
    "\u201c\u201d\u201e\u201f\u2033\u2036", '"'
))  # fmt: skip
# The CJK ideograph blocks that BERT's tokenizer puts spaces around (BasicTokenizer._is_chinese_char)
CJK = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)  # fmt: skip


def _char_class(chars: list[int], ranges: tuple[tuple[int, int], ...] = ()) -> str:
    """A regular expression character class of the code points ``chars`` and the inclusive ``ranges``."""
    spans = sorted([(c, c) for c in chars] + list(ranges))
    merged: list[list[int]] = []
    for first, last in spans:
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    return "[" + "".join(_escape(a) if a == b else f"{_escape(a)}-{_escape(b)}" for a, b in merged) + "]"


def _escape(code: int) -> str:
    return f"\\U{code:08x}"


@functools.cache
def _categories() -> dict[str, list[int]]:
    """The code points of the Unicode categories the folding needs (this Python's Unicode data; read once, 0.2 s)."""
    found: dict[str, list[int]] = {"P": [], "Cf": []}
    for code in range(sys.maxunicode + 1):
        category = unicodedata.category(chr(code))
        if category[0] == "P":
            found["P"].append(code)
        elif category == "Cf":
            found["Cf"].append(code)
    return found


@functools.cache
def ignored() -> str:
    """:data:`IGNORED` and every format character (category Cf), as one character class."""
    return IGNORED[:-1] + _char_class(_categories()["Cf"])[1:]


@functools.cache
def split_marks() -> str:
    """A space next to a character that BERT's tokenizer makes a token of its own (ASCII punctuation, Unicode
    category P, a CJK ideograph): "the company 's plan ." and "the company's plan." are one token sequence."""
    ascii_marks = [code for code in range(33, 127) if not chr(code).isalnum()]
    marks = _char_class(ascii_marks + _categories()["P"], CJK)
    return f" (?={marks})|(?<={marks}) "


def fold(texts: pd.Series) -> pd.Series:
    """Each text folded as the module docstring says (missing: empty)."""
    texts = texts.fillna("").astype(str).map(lambda text: html.unescape(text) if "&" in text else text)
    return (
        texts.str.translate(QUOTES)
        .str.normalize("NFKD")
        .str.casefold()  # (after NFKD, which makes letters of some symbols: "ℌ" is "H")
        .str.replace(ignored(), "", regex=True)  # (after casefold, which can add a mark: "İ" is "i" and U+0307)
        .str.replace(r"\s+", " ", regex=True)
        .str.replace(split_marks(), "", regex=True)
        .str.strip()
    )


def text_hashes(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    """A 64-bit hash of each row's folded (text, text pair)."""
    return folded_hashes(fold_columns(frame, columns))


def fold_columns(frame: pd.DataFrame, columns: list[str]) -> dict[str, pd.Series]:
    """The :func:`fold`-ed texts of each of ``columns`` (the text, the text pair): fold once, compare several ways."""
    return {column: fold(frame[column]) for column in columns}


def folded_hashes(folded: dict[str, pd.Series], prefix: int | None = None) -> np.ndarray:
    """:func:`text_hashes` of texts already folded (:func:`fold_columns`), or of their first ``prefix`` characters."""
    if prefix is not None:
        folded = {column: texts.str.slice(0, prefix) for column, texts in folded.items()}
    table = pd.DataFrame({column: texts.to_numpy() for column, texts in folded.items()})
    return pd.util.hash_pandas_object(table, index=False).to_numpy(np.uint64)


def copy_prefix(max_length: int, pairs: bool) -> int:
    """The folded characters two texts (each text of two pairs) must share to be one input to a model keeping
    ``max_length`` tokens (docs/your-own-models-and-data.md, "When two texts are the same")."""
    return (max_length - 3) // 2 if pairs else max_length - 2
