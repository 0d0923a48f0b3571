"""Tokenisation and length-bucketed batching (docs/design.md, "Compute": no padding to max_length).

A split is tokenised once into variable-length id arrays (:class:`Encoded`). Batches are index arrays into it:
for training, indices are shuffled, cut into windows of ``window`` batches, sorted by length inside each window
and cut into batches whose order is shuffled again; for inference, all rows are sorted by length. A batch is padded
only to its own longest row.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Encoded:
    """A tokenised split: one int array per row (already truncated), in the split's row order."""

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray] | None
    row_ids: np.ndarray
    labels: np.ndarray | None
    pad_id: int
    pair_ids: list[np.ndarray] | None = None  # the second text, tokenised on its own (``separate_pairs``)

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        lengths = np.fromiter((len(ids) for ids in self.input_ids), dtype=np.int64, count=len(self.input_ids))
        if self.pair_ids is not None:
            lengths += np.fromiter((len(ids) for ids in self.pair_ids), dtype=np.int64, count=len(self.pair_ids))
        return lengths

    @property
    def token_hashes(self) -> np.ndarray:
        """A CRC-32 of each row's token ids: two tokenisations of a split agree row by row exactly when these do
        (a cheap fingerprint that a feature dump keeps, so a student can check it tokenises as the teacher did)."""
        pairs = self.pair_ids if self.pair_ids is not None else [()] * len(self)
        return np.fromiter(
            (
                zlib.crc32(np.concatenate([ids, np.asarray(p, dtype=np.int64)]).tobytes())
                for ids, p in zip(self.input_ids, pairs)
            ),
            dtype=np.int64,
            count=len(self),
        )


def _arrays(rows) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.int64) for x in rows]


# Rows tokenised at a time. A fast tokenizer keeps, per row, an encoding object with the tokens, offsets and the
# truncated rest of the text, many times the ids it returns: tokenising a whole split at once raised the peak memory
# by about 85 KB per BBC article (341 MB for 4,000 rows at max_length 64; 97 MB in chunks of 512), so memory grew
# with the split (benchmarks/RESULTS.md, "How cost grows with the work").
TOKENIZE_CHUNK = 512


def _tokenized(tokenizer, texts: list, pairs: list | None, options: dict) -> dict[str, list[np.ndarray]]:
    """The tokenizer's ``input_ids`` and, when it makes them, ``token_type_ids`` of every row as int64 arrays,
    tokenised TOKENIZE_CHUNK rows at a time (the same ids as one call)."""
    out: dict[str, list[np.ndarray]] = {}
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        end = start + TOKENIZE_CHUNK
        part = tokenizer(texts[start:end], pairs[start:end] if pairs is not None else None, **options)
        for field in ("input_ids", "token_type_ids"):
            if part.get(field) is not None:
                out.setdefault(field, []).extend(_arrays(part[field]))
    return out


def encode(
    tokenizer, texts, text_pairs=None, *, max_length: int, row_ids=None, labels=None, separate_pairs: bool = False
) -> Encoded:
    """Tokenise without padding. Pairs are encoded as one pair sequence (``truncation="longest_first"``), the
    transformer way, or with ``separate_pairs`` each side on its own, each cut to ``max_length`` (the BiLSTM's
    way: it encodes the two sides apart, docs/methods.md §5)."""
    texts = list(texts)
    pairs = list(text_pairs) if text_pairs is not None else None
    options = dict(truncation=True, max_length=max_length, padding=False, return_attention_mask=False)
    pair_ids = types = None
    if separate_pairs:
        ids = _tokenized(tokenizer, texts, None, options).get("input_ids", [])
        pair_ids = _tokenized(tokenizer, pairs, None, options).get("input_ids", []) if pairs is not None else None
    else:
        out = _tokenized(tokenizer, texts, pairs, options)
        ids, types = out.get("input_ids", []), out.get("token_type_ids")
    return Encoded(
        input_ids=ids,
        token_type_ids=types,
        row_ids=np.arange(len(ids), dtype=np.int64) if row_ids is None else np.asarray(row_ids, dtype=np.int64),
        labels=None if labels is None else np.asarray(labels, dtype=np.int64),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        pair_ids=pair_ids,
    )


def training_batches(
    lengths: np.ndarray, batch_size: int, *, seed: int, epoch: int, window: int = 50
) -> list[np.ndarray]:
    """Shuffled, length-bucketed batches; the same (seed, epoch) always gives the same batches (for resume)."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    span = batch_size * window
    batches = []
    for start in range(0, len(order), span):
        chunk = order[start : start + span]
        chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    return [batches[i] for i in rng.permutation(len(batches))]


def inference_batches(lengths: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """All rows sorted by length (longest first, so running out of memory shows at once), in fixed batches."""
    order = np.argsort(-lengths, kind="stable")
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


# A shard of a pass: (k, S) runs every S-th batch from the k-th (0-based k); WHOLE is the unsharded pass
# (see kdpipe.signals.shards).
WHOLE = (0, 1)


def shard_batches(batches: list[np.ndarray], shard: tuple[int, int]) -> list[np.ndarray]:
    """The batches shard ``(k, S)`` runs: every S-th batch from the k-th."""
    k, count = shard
    return batches[k::count]


def _pad(rows: list[np.ndarray], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows padded to the longest of them, and their attention mask."""
    width = max(len(r) for r in rows)
    ids = np.full((len(rows), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for j, r in enumerate(rows):
        ids[j, : len(r)] = r
        mask[j, : len(r)] = 1
    return ids, mask


def collate(encoded: Encoded, index: np.ndarray, device: torch.device | None = None) -> dict:
    """Pad the rows ``index`` to their longest length; returns model inputs plus ``index`` and ``labels`` (and
    ``pair_input_ids`` / ``pair_attention_mask``, padded apart, when the pairs were tokenised separately)."""
    input_ids, mask = _pad([encoded.input_ids[i] for i in index], encoded.pad_id)
    batch = {"input_ids": input_ids, "attention_mask": mask}
    if encoded.pair_ids is not None:
        batch["pair_input_ids"], batch["pair_attention_mask"] = _pad(
            [encoded.pair_ids[i] for i in index], encoded.pad_id
        )
    if encoded.token_type_ids is not None:
        types = np.zeros_like(input_ids)
        for j, i in enumerate(index):
            types[j, : len(encoded.token_type_ids[i])] = encoded.token_type_ids[i]
        batch["token_type_ids"] = types
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
    pairs = frame["text_pair"].tolist() if "text_pair" in frame.columns else None
    return encode(
        tokenizer,
        frame["text"].tolist(),
        pairs,
        max_length=max_length,
        row_ids=frame["row_id"].to_numpy(),
        labels=label_ids,
        separate_pairs=separate_pairs,
    )
