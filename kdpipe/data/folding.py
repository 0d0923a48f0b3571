"""Texts compared as a model reads them (docs/your-own-models-and-data.md, "When two texts are the same"): one folding
for prepare's duplicate and conflict checks (kdpipe.data.prepare, kdpipe.data.conflicts) and for the leak filters of
the transfer rows and an external OOD set (kdpipe.data.transfer, kdpipe.data.ood).

A text is folded the way an uncased tokenizer reads it: HTML entities decoded (``&amp;`` is ``&``, ``&#8217;`` is
``’``), typographic quotes made plain (``’`` is ``'``, ``“`` is ``"``), Unicode compatibility forms (NFKD), accents and
invisible characters removed (:data:`IGNORED`), case folded, white space collapsed to one space and trimmed. A copy of
a test text in capitals, without its accents, with a zero-width space, a trailing space, Windows line breaks, curly
quotes or ``&quot;`` is the same text to the builtin MiniLM's tokenizer, so it leaks all the same.

:func:`copy_prefix` bounds what a model sees of a long text: a text that begins with the same folded characters as
another is the same model input once both are cut at ``max_length`` tokens.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd

# What the comparison of texts ignores beside white space: accents and other combining marks (after NFKD; the common
# blocks) and invisible format characters (soft hyphen, zero-width spaces and joiners, direction marks, BOM)
IGNORED = (
    r"[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f"
    r"\u00ad\u200b-\u200f\u202a-\u202e\u2060-\u2064\ufeff]"
)
# Typographic quotes and apostrophes as the plain ones (NFKD leaves them): single, then double
QUOTES = str.maketrans(dict.fromkeys("\u2018\u2019\u201a\u201b\u2032\u2035\u02bc", "'") | dict.fromkeys(
    "\u201c\u201d\u201e\u201f\u2033\u2036", '"'
))  # fmt: skip


def fold(texts: pd.Series) -> pd.Series:
    """Each text folded as the module docstring says (missing: empty)."""
    texts = texts.fillna("").astype(str).map(lambda text: html.unescape(text) if "&" in text else text)
    return (
        texts.str.translate(QUOTES)
        .str.normalize("NFKD")
        .str.replace(IGNORED, "", regex=True)
        .str.casefold()
        .str.replace(r"\s+", " ", regex=True)
        .str.strip()
    )


def text_hashes(frame: pd.DataFrame, columns: list[str], prefix: int | None = None) -> np.ndarray:
    """A 64-bit hash of each row's (text, text pair), each :func:`fold`-ed; with ``prefix``, of the first ``prefix``
    folded characters of each (:func:`copy_prefix`)."""
    folded = {column: fold(frame[column]) for column in columns}
    if prefix is not None:
        folded = {column: texts.str.slice(0, prefix) for column, texts in folded.items()}
    table = pd.DataFrame({column: texts.to_numpy() for column, texts in folded.items()})
    return pd.util.hash_pandas_object(table, index=False).to_numpy(np.uint64)


def copy_prefix(max_length: int, pairs: bool) -> int:
    """The folded characters that two texts (or each text of two pairs) must share to be one input to a model that
    keeps ``max_length`` tokens. A model input spends two tokens on [CLS] and [SEP] (three with a text pair, whose
    longer text is cut first, so each keeps at least half of the rest), and a token of a WordPiece or SentencePiece
    tokenizer covers at least one character of the folded text (a space counts as one): two texts cut at
    ``max_length`` tokens that tokenise alike begin with the same ``max_length - 2`` folded characters (each text of a
    pair with the same ``(max_length - 3) // 2``). Comparing those many characters finds every such copy, and takes
    for a copy a text that differs only later: a conservative leak filter. Where a token can hold less than a folded
    character (byte-level BPE on characters outside ASCII, an HTML entity's several tokens), a copy can escape."""
    return (max_length - 3) // 2 if pairs else max_length - 2
