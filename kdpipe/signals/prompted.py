"""A prompted causal-LM teacher's pass over a split (docs/methods.md §7), written as the ``logits`` and ``mc`` signals.

Every class's probability is read from the log-probabilities of its verbalizers, never generated; a prompt ensemble
(templates × verbalizer sets × draws of few-shot examples) gives the uncertainty; the ``logits`` and ``mc`` signals
are those every method, router and evaluation reads, and every member's probabilities are written beside them.

**Fast passes.** Each member's prompt is cut into the prefix every row shares (the instruction, the few-shot
examples, the chat template's header) and each row's own tokens. The prefix runs once per member and its key/value
cache serves every batch; a batch of rows, left-padded, and the tokens of every multi-token verbalizer after them
run as one forward with an attention mask of their own (each verbalizer sees the prefix, its row and its own earlier
tokens; positions continue after the prefix), so every class of every row is scored in one forward, however many
tokens its verbalizers have. :func:`naive_log_scores` is the same computation row by row on the whole prompt, the
reference the tests hold the fast pass to.

**Shards.** The pass cuts a split into one fixed list of batches (rows sorted by length, longest first) and shard k
of S runs batches k, k + S, ... (docs/design.md, "Signals"): :func:`run_shard` writes a part folder with the
sub-folders ``logits``, ``mc`` and ``prompt`` (:mod:`kdpipe.signals.parts`), which
:func:`kdpipe.signals.prompt_members.gather` turns into the ``logits`` and ``mc`` artifacts and ``prompt.npy``;
:func:`run_pass` does all of it in one job.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from kdpipe.core import progress
from kdpipe.core.device import autocast, pick_device
from kdpipe.core.memory import release_freed_memory
from kdpipe.core.store import (
    KdpipeError,
    atomic_path,
    scratch_folder,
)
from kdpipe.data.batching import WHOLE, Batches, Ragged, inference_batches, shard_batches
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.models.causal_lm import check_causal_lm_folder, load_causal_lm, load_causal_lm_tokenizer
from kdpipe.signals.mc_dropout import SCORES, summarise
from kdpipe.signals.parts import finish_part, parse_shard, shard_rows
from kdpipe.signals.prompt_members import gather
from kdpipe.signals.prompt_settings import PromptPassSettings, PromptSettings
from kdpipe.signals.prompts import (
    SHOT_SEPARATOR,
    answer_gap,
    draw_shots,
    fill,
    members,
    split_template,
    typed,
)

# Marks of the row's slots in a rendered prompt, where it is cut into the shared prefix and the row's own pieces
TEXT_MARK, PAIR_MARK = "\u27e6kdpipe:text\u27e7", "\u27e6kdpipe:text_pair\u27e7"
# Rows × keys of one forward (the rows of a batch run in chunks below it): a long few-shot prefix's cache is copied
# for every row of the forward, so this bounds the memory it takes (for SmolLM2-135M, 46 KB per key and row)
MAX_BATCH_TOKENS = 16384
SIGNAL_NAMES = ("logits", "mc", "prompt")  # the sub-folders of a part
TOKENIZE_CHUNK = 512


@dataclass
class Member:
    """One member of the prompt ensemble, tokenised: the ids every row shares (``prefix``), the pieces around the
    row's text and its pair (the white space moved from the prompt onto the text, the ids between the text and its
    pair, the ids after the row), and every verbalizer's ids with its class."""

    name: str
    prefix: list[int]
    text_space: str
    middle: list[int]
    pair_space: str
    suffix: list[int]
    verbalizers: list[list[int]]
    owners: list[int]  # the class (its index) of each verbalizer
    shot_rows: list[int] = field(default_factory=list)  # row ids of its few-shot examples, in prompt order
    shot_labels: list[str] = field(default_factory=list)
    prompt: str = ""  # the rendered prompt, the row's slots marked


def _ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def leading_specials(tokenizer) -> list[int]:
    """The special tokens the tokenizer puts before a text of its own accord (a beginning-of-text token), which
    start a prompt without a chat template; those it puts after a text (an end-of-text token) are left out."""
    plain = _ids(tokenizer, "a")
    marked = list(tokenizer("a", add_special_tokens=True)["input_ids"])
    for start in range(len(marked) - len(plain) + 1):
        if marked[start : start + len(plain)] == plain:
            return marked[:start]
    return []


def use_chat(chat, tokenizer, where: str) -> bool:
    """Whether the prompts go through the tokenizer's chat template: ``auto`` when it has one, ``true`` (it must
    have one), ``false`` never."""
    has = bool(getattr(tokenizer, "chat_template", None))
    if chat is True and not has:
        raise KdpipeError(f"{where}.chat: true, but the model's tokenizer has no chat template; set chat: false")
    return has if chat == "auto" else bool(chat)


def cut_texts(tokenizer, text: str, pair: str | None, max_length: int) -> tuple[str, str | None]:
    """A few-shot example's text (and pair) cut to ``max_length`` tokens together, the longer one first, as a row's
    are (:func:`encode_rows`), at a token's end in the text itself (so nothing is decoded)."""
    pieces = [text] if pair is None else [text, pair]
    encodings = [tokenizer(p, add_special_tokens=False, return_offsets_mapping=True) for p in pieces]
    counts = _longest_first([len(e["input_ids"]) for e in encodings], max_length)
    cut = []
    for piece, encoding, kept in zip(pieces, encodings, counts):
        if kept >= len(encoding["input_ids"]):
            cut.append(piece)
        else:
            cut.append(piece[: encoding["offset_mapping"][kept - 1][1]] if kept else "")
    return cut[0], (cut[1] if pair is not None else None)


def _longest_first(lengths: list[int], limit: int) -> list[int]:
    """Token counts kept of each piece so that together they fit ``limit``: a token off the longer piece at a time
    (the first on a tie)."""
    kept = list(lengths)
    while sum(kept) > limit:
        longest = max(range(len(kept)), key=lambda i: (kept[i], -i))
        kept[longest] -= 1
    return kept


def _shot_texts(tokenizer, shots_frame, positions, max_length: int) -> list[tuple[str, str | None, str]]:
    pairs = "text_pair" in shots_frame.columns
    out = []
    for at in positions:
        row = shots_frame.iloc[int(at)]
        text, pair = cut_texts(tokenizer, str(row["text"]), str(row["text_pair"]) if pairs else None, max_length)
        out.append((text, pair, str(row["label"])))
    return out


def render(template: str, words: dict[str, list[str]], classes: list[str], shots, chat, where: str) -> str:
    """A member's prompt with the row's slots marked (:data:`TEXT_MARK`, :data:`PAIR_MARK`): the template's
    instruction, every few-shot example followed by its class's first verbalizer, then the row's example; through
    ``chat(messages)`` (the tokenizer's chat template, its assistant turn opened) when given, the examples as turns
    of the conversation (docs/methods.md §7)."""
    cut = split_template(template)
    labels = ", ".join(words[name][0] for name in classes)

    def example(text, pair):
        return fill(cut.example, {"text": text, "text_pair": pair or "", "labels": labels})

    instruction = fill(cut.instruction, {"labels": labels})
    row = example(TEXT_MARK, PAIR_MARK)
    if chat is None:
        said = [example(text, pair) for text, pair, _ in shots]
        answered = [s + answer_gap(s) + words[name][0] + SHOT_SEPARATOR for s, (_, _, name) in zip(said, shots)]
        return instruction + "".join(answered) + row
    messages = []
    for text, pair, name in shots:
        messages += [{"role": "user", "content": example(text, pair)}, {"role": "assistant", "content": words[name][0]}]
    messages.append({"role": "user", "content": row})
    messages[0] = {"role": "user", "content": instruction + messages[0]["content"]}
    try:
        rendered = chat(messages)
    except Exception as err:  # a template's own raise_exception, or any Jinja error
        first = (str(err).strip().splitlines() or [type(err).__name__])[0][:200]
        raise KdpipeError(
            f"{where}: the tokenizer's chat template fails to render the prompt ({first}); "
            "set chat: false to prompt without it"
        ) from err
    return rendered


def _split_rendered(rendered: str, pairs: bool, where: str) -> tuple[str, str, str]:
    """The rendered prompt cut at the row's slots: (prefix, between text and pair, suffix)."""
    marks = [TEXT_MARK, PAIR_MARK] if pairs else [TEXT_MARK]
    if any(rendered.count(mark) != 1 for mark in marks) or (
        pairs and rendered.find(PAIR_MARK) < rendered.find(TEXT_MARK)
    ):
        raise KdpipeError(f"{where}: the chat template does not keep the row's text as it is given; set chat: false")
    if not pairs:
        prefix, suffix = rendered.split(TEXT_MARK)
        return prefix, "", suffix
    prefix, rest = rendered.split(TEXT_MARK)
    middle, suffix = rest.split(PAIR_MARK)
    return prefix, middle, suffix


def _trailing_space(text: str) -> tuple[str, str]:
    """``text`` without its trailing spaces and tabs, and those (they go onto the next piece, so that a word keeps
    its space: "Article: " + "Tech" is tokenised "Article:" + " Tech")."""
    kept = text.rstrip(" \t")
    return kept, text[len(kept) :]


def prepare_members(
    settings: PromptSettings, tokenizer, classes: list[str], *, pairs: bool, shots_frame=None, where: str = "prompt"
) -> list[Member]:
    """Every member of the prompt ensemble, tokenised, with the checks that need the tokenizer: a chat template that
    fails to render, a verbalizer that tokenises to nothing, two verbalizers (of one class or two) that tokenise
    alike. ``settings``: the prompt settings (:func:`kdpipe.signals.prompts.typed`). ``shots_frame``: the train
    split (columns row_id, text, label, and text_pair for pairs), from which each draw's few-shot examples are
    drawn; None with shots > 0 renders placeholder examples (for the checks alone)."""
    chat = None
    if use_chat(settings.chat, tokenizer, where):

        def chat(messages):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    lead = [] if chat else leading_specials(tokenizer)
    prepared = []
    for spec in members(settings):
        words = settings.verbalizers[spec["verbalizers"]]
        template = settings.templates[spec["template"]]
        at = f"{where}.templates[{spec['template']}]"
        if settings.shots and shots_frame is not None:
            positions = draw_shots(
                shots_frame["label"].to_numpy(),
                classes,
                shots=settings.shots,
                draw=spec["draw"],
                seed=settings.seed,
                where=where,
            )
            shots = _shot_texts(tokenizer, shots_frame, positions, settings.max_length)
            shot_rows = [int(r) for r in shots_frame["row_id"].to_numpy()[positions]]
        else:
            shots = [("...", "..." if pairs else None, name) for name in classes for _ in range(settings.shots)]
            shot_rows = []
        rendered = render(template, words, classes, shots, chat, at)
        prefix, middle, suffix = _split_rendered(rendered, pairs, at)
        prefix, text_space = _trailing_space(prefix)
        middle, pair_space = _trailing_space(middle)
        suffix, answer_space = _trailing_space(suffix)
        gap = answer_space or answer_gap(suffix)
        several = len(settings.verbalizers) > 1
        at_words = f"{where}.verbalizers" + (f"[{spec['verbalizers']}]" if several else "")
        verbalizers, owners = _verbalizer_ids(tokenizer, words, classes, gap, at_words)
        prepared.append(
            Member(
                name=spec["name"],
                prefix=lead + _ids(tokenizer, prefix),
                text_space=text_space,
                middle=_ids(tokenizer, middle),
                pair_space=pair_space,
                suffix=_ids(tokenizer, suffix),
                verbalizers=verbalizers,
                owners=owners,
                shot_rows=shot_rows,
                shot_labels=[name for _, _, name in shots] if shot_rows else [],
                prompt=rendered,
            )
        )
    return prepared


def _verbalizer_ids(tokenizer, words, classes, gap: str, at: str):
    """Every verbalizer's ids (after the prompt's white space ``gap``) and its class; ``at``: the config key."""
    seen: dict[tuple[int, ...], tuple[str, str]] = {}
    verbalizers, owners = [], []
    for c, name in enumerate(classes):
        for word in words[name]:
            ids = tuple(_ids(tokenizer, gap + word))
            if not ids:
                raise KdpipeError(f"{at}.{name}: {word!r} tokenises to nothing")
            if ids in seen:
                other_class, other_word = seen[ids]
                why = (
                    "so that class's probability would count them twice; drop one"
                    if other_class == name
                    else "so the two classes cannot be told apart; drop one or name another word"
                )
                raise KdpipeError(
                    f"{at}: {other_word!r} ({other_class}) and {word!r} ({name}) tokenise to the same ids {list(ids)}, "
                    + why
                )
            seen[ids] = (name, word)
            verbalizers.append(list(ids))
            owners.append(c)
    return verbalizers, owners


def check_tokenizer(
    prompt: PromptSettings | dict, tokenizer, *, classes: list[str], pairs: bool, where: str = "prompt"
) -> None:
    """The checks of a prompted teacher that need its tokenizer (:func:`prepare_members`, with placeholder
    few-shot examples), run before any weights are loaded. ``prompt``: the config's ``prompt`` section or its
    settings."""
    if isinstance(prompt, PromptSettings):
        prompt = prompt.to_dict()
    settings = typed(prompt, classes=classes, pairs=pairs, where=where)
    prepare_members(settings, tokenizer, classes, pairs=pairs, where=where)


@dataclass
class RowTokens:
    """The rows' texts (and pairs) tokenised as a member reads them: the white space moved from the prompt first,
    no special token, cut to ``max_length`` tokens together (the longer piece first)."""

    text: Ragged
    pair: Ragged | None

    def segment(self, member: Member, i: int) -> np.ndarray:
        """Row ``i``'s own ids: the prefix's last id, its text, the ids between text and pair, its pair, the
        ids after it."""
        parts = [member.prefix[-1:], self.text[i]]
        if self.pair is not None:
            parts += [member.middle, self.pair[i]]
        parts.append(member.suffix)
        return np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])

    def lengths(self, member: Member) -> np.ndarray:
        lengths = self.text.lengths + min(len(member.prefix), 1) + len(member.suffix)
        if self.pair is not None:
            lengths = lengths + self.pair.lengths + len(member.middle)
        return lengths


class _Flat:
    """Rows of ids gathered a chunk at a time into flat arrays (memory flat in N: no Python list per row)."""

    def __init__(self):
        self.values: list[np.ndarray] = []
        self.lengths: list[np.ndarray] = []

    def add(self, rows) -> None:
        lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
        self.lengths.append(lengths)
        self.values.append(np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum())))

    def ragged(self) -> Ragged:
        lengths = np.concatenate([np.zeros(0, np.int64), *self.lengths])
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        values = np.concatenate([np.zeros(0, np.int64), *self.values])
        if not len(values) or values.max() < 2**31:  # (int32 holds every vocabulary: half the memory)
            values = values.astype(np.int32)
        return Ragged(values, offsets)


def encode_rows(tokenizer, texts, pairs, *, text_space: str, pair_space: str, max_length: int) -> RowTokens:
    """:class:`RowTokens` of ``texts`` (and ``pairs``; lists or pandas columns), tokenised :data:`TOKENIZE_CHUNK`
    rows at a time."""
    cut = dict(truncation=True, max_length=max_length, add_special_tokens=False)
    text_rows, pair_rows = _Flat(), _Flat()
    for start in range(0, len(texts), TOKENIZE_CHUNK):
        chunk = [text_space + str(t) for t in _chunk(texts, start)]
        ids = tokenizer(chunk, **cut)["input_ids"]
        if pairs is None:
            text_rows.add(ids)
            continue
        pair_ids = tokenizer([pair_space + str(p) for p in _chunk(pairs, start)], **cut)["input_ids"]
        kept = [_longest_first([len(a), len(b)], max_length) for a, b in zip(ids, pair_ids)]
        text_rows.add([a[:n] for a, (n, _) in zip(ids, kept)])
        pair_rows.add([b[:n] for b, (_, n) in zip(pair_ids, kept)])
    return RowTokens(text_rows.ragged(), pair_rows.ragged() if pairs is not None else None)


def _chunk(values, start: int) -> list:
    end = start + TOKENIZE_CHUNK
    return values.iloc[start:end].tolist() if hasattr(values, "iloc") else list(values[start:end])


@dataclass
class _Verbalizers:
    """A member's verbalizers laid out for one forward: every verbalizer's first id (read at the row's last
    position) and the block of the other tokens' inputs after the row (a verbalizer of n tokens puts its first
    n - 1 there), with where each later token's log-probability is read."""

    first: torch.Tensor  # [V] the first id of each verbalizer
    block: torch.Tensor  # [T] input ids of the verbalizer block
    block_offset: torch.Tensor  # [T] each block token's place in its verbalizer (0: its first id)
    block_mask: torch.Tensor  # [T, T] bool: block token q sees block token k (same verbalizer, k <= q)
    read_column: torch.Tensor  # [R] the kept logit column (0: the row's last position) that predicts ...
    read_token: torch.Tensor  # [R] ... this id ...
    read_owner: torch.Tensor  # [R] ... of this verbalizer
    classes: torch.Tensor  # [V, C] bool: verbalizer v belongs to class c

    @classmethod
    def of(cls, member: Member, n_classes: int) -> _Verbalizers:
        block, offset, owner_of_block, column, token, owner = [], [], [], [], [], []
        for v, ids in enumerate(member.verbalizers):
            start = len(block)
            for i in range(1, len(ids)):  # the input ids[i - 1] predicts ids[i], read at column 1 + its place
                block.append(ids[i - 1])
                offset.append(i - 1)
                owner_of_block.append(v)
                column.append(1 + start + i - 1)
                token.append(ids[i])
                owner.append(v)
        owners = torch.tensor(owner_of_block, dtype=torch.long)
        places = torch.arange(len(block))
        mask = (owners[:, None] == owners[None, :]) & (places[None, :] <= places[:, None])
        classes = torch.zeros(len(member.verbalizers), n_classes, dtype=torch.bool)
        classes[torch.arange(len(member.owners)), torch.tensor(member.owners)] = True
        long = dict(dtype=torch.long)
        return cls(
            torch.tensor([ids[0] for ids in member.verbalizers], **long),
            torch.tensor(block, **long),
            torch.tensor(offset, **long),
            mask,
            torch.tensor(column, **long),
            torch.tensor(token, **long),
            torch.tensor(owner, **long),
            classes,
        )

    def to(self, device: torch.device) -> _Verbalizers:
        """The same layout with its tensors on ``device`` (where the forward's log-probabilities are read)."""
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)})


def _class_scores(verbalizer_scores: torch.Tensor, classes: torch.Tensor) -> torch.Tensor:
    """[B, C] the log-sum-exp of each class's verbalizer log-probabilities ([B, V])."""
    masked = verbalizer_scores[:, :, None].masked_fill(~classes[None], float("-inf"))
    return torch.logsumexp(masked, dim=1)


def _prefix_cache(model, prefix: list[int], device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of every layer for the prefix's ids but the last (that one starts each row's segment)."""
    if len(prefix) < 2:
        return []
    ids = torch.tensor([prefix[:-1]], dtype=torch.long, device=device)
    with autocast(device):
        cache = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values
    return [(layer.keys, layer.values) for layer in cache.layers]


def _batch_cache(model, kv, rows: int):
    from transformers import DynamicCache

    if not kv:
        return None
    cache = DynamicCache(config=model.config)
    for index, (keys, values) in enumerate(kv):
        cache.update(keys.expand(rows, -1, -1, -1), values.expand(rows, -1, -1, -1), index)
    return cache


def _attention_mask(model, allowed: torch.Tensor) -> torch.Tensor:
    """The 4D mask [B, 1, Q, K] in the form the model's attention takes: booleans for SDPA, an additive float
    mask for eager attention."""
    implementation = getattr(model.config, "_attn_implementation", "sdpa")
    if implementation == "sdpa":
        return allowed[:, None]
    if implementation == "eager":
        dtype = next(model.parameters()).dtype
        blocked = torch.finfo(torch.float32 if dtype == torch.float32 else dtype).min
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, blocked)[:, None]
    raise KdpipeError(f"a prompted teacher runs with SDPA or eager attention, not {implementation!r}")


def _forward_rows(
    model, kv, segments: list[np.ndarray], words: _Verbalizers, device, pad_id: int, pooled: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Every verbalizer's log-probability [B, V] for rows whose own ids are ``segments``, after the prefix whose
    cache is ``kv``: one forward of the left-padded rows and the verbalizer block; with ``pooled``, also each row's
    mean last-layer hidden state over its own ids [B, H] (float32), else None."""
    rows, prefix = len(segments), (kv[0][0].shape[-2] if kv else 0)
    lengths = torch.tensor([len(s) for s in segments], dtype=torch.long)
    width, block = int(lengths.max()), len(words.block)
    ids = torch.full((rows, width + block), pad_id, dtype=torch.long)
    for b, seg in enumerate(segments):
        ids[b, width - len(seg) : width] = torch.from_numpy(seg)
    ids[:, width:] = words.block.cpu()
    columns = torch.arange(width)
    starts = width - lengths
    real = columns[None, :] >= starts[:, None]  # [B, W]: the row's own ids (left padding)
    positions = torch.cat(
        [
            prefix + (columns[None, :] - starts[:, None]).clamp(min=0),
            prefix + lengths[:, None] + words.block_offset.cpu()[None],
        ],
        dim=1,
    )
    queries = width + block
    allowed = torch.zeros(rows, queries, prefix + queries, dtype=torch.bool)
    allowed[:, :, :prefix] = True
    allowed[:, :width, prefix : prefix + width] = (
        torch.tril(torch.ones(width, width, dtype=torch.bool))[None] & real[:, None, :]
    )
    allowed[:, width:, prefix : prefix + width] = real[:, None, :]
    allowed[:, width:, prefix + width :] = words.block_mask.cpu()[None]
    diagonal = torch.arange(queries)
    allowed[:, diagonal, prefix + diagonal] = True  # (a padding query sees itself: no row of the mask is empty)
    with autocast(device):
        out = model(
            input_ids=ids.to(device),
            attention_mask=_attention_mask(model, allowed.to(device)),
            position_ids=positions.to(device),
            past_key_values=_batch_cache(model, kv, rows),
            use_cache=True,
            logits_to_keep=block + 1,
            output_hidden_states=pooled,
        )
    logp = torch.log_softmax(out.logits.float(), dim=-1)  # [B, block + 1, vocab], on the device
    scores = logp[:, 0, words.first]
    if len(words.read_column):
        scores = scores.index_add(1, words.read_owner, logp[:, words.read_column, words.read_token])
    if not pooled:
        return scores, None
    weights = real.to(device=device, dtype=torch.float32)[..., None]  # the row's own ids, not its padding
    hidden = out.hidden_states[-1][:, :width].float()
    return scores, (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def _check_lengths(model, member: Member, longest: int, where: str) -> None:
    total = len(member.prefix) + longest + max(len(v) for v in member.verbalizers)
    limit = getattr(model.config, "max_position_embeddings", None)
    if isinstance(limit, int) and total > limit:
        raise KdpipeError(
            f"{where}: member {member.name}'s prompts reach {total} tokens, beyond the model's "
            f"{limit} positions; lower max_length or shots"
        )
    from transformers import DynamicCache

    windows = [layer.sliding_window for layer in DynamicCache(config=model.config).layers if layer.is_sliding]
    if windows and total > min(windows):
        raise KdpipeError(
            f"{where}: member {member.name}'s prompts reach {total} tokens, beyond the model's sliding attention "
            f"window of {min(windows)}; lower max_length or shots"
        )


@torch.inference_mode()
def member_log_scores(
    model,
    member: Member,
    rows: RowTokens,
    batches: Batches,
    n_classes: int,
    *,
    device: torch.device,
    pad_id: int,
    desc: str | None = None,
    where: str = "prompt",
    pooled: np.ndarray | None = None,
) -> np.ndarray:
    """Each class's log-score [N, C] (float32; only the rows of ``batches`` filled) under one member: the
    log-sum-exp over its verbalizers of each verbalizer's log-probability after the row's prompt (the sum over its
    tokens, each given the prompt and the verbalizer's earlier tokens). The prefix runs once; each batch is one
    forward (in chunks of at most :data:`MAX_BATCH_TOKENS` rows × keys). ``pooled`` [N, H], when given, gets each
    row's mean last-layer hidden state over its own ids in this member's prompt (the ``pooled`` signal)."""
    model.eval()
    out = np.zeros((len(rows.text), n_classes), dtype=np.float32)
    words = _Verbalizers.of(member, n_classes).to(device)
    if len(batches.rows):
        _check_lengths(model, member, int(rows.lengths(member)[batches.rows].max()), where)
    kv = _prefix_cache(model, member.prefix, device)
    prefix = max(len(member.prefix) - 1, 0)
    with progress.bar(len(batches.rows), desc) as bar:
        for index in batches:
            segments = [rows.segment(member, int(i)) for i in index]
            if not all(len(s) for s in segments):
                raise KdpipeError(
                    f"{where}: member {member.name} gives a row an empty prompt; add text to the template"
                )
            per_forward = max(1, MAX_BATCH_TOKENS // (prefix + max(map(len, segments)) + len(words.block)))
            for start in range(0, len(index), per_forward):
                chunk, rows_at = segments[start : start + per_forward], index[start : start + per_forward]
                scores, states = _forward_rows(model, kv, chunk, words, device, pad_id, pooled is not None)
                out[rows_at] = _class_scores(scores, words.classes).cpu().numpy()
                if states is not None:
                    pooled[rows_at] = states.cpu().numpy()
            bar.update(len(index))
    return out


@torch.inference_mode()
def naive_log_scores(model, member: Member, rows: RowTokens, index, n_classes: int, *, device) -> np.ndarray:
    """:func:`member_log_scores` the plain way, for the rows ``index`` ([len(index), C]): per row, the whole
    prompt through the model, with no cache, no padding and no mask of its own; a single-token verbalizer read from
    that forward, a longer one from a forward of the prompt and its own tokens."""
    model.eval()
    out = np.zeros((len(index), n_classes), dtype=np.float32)
    classes = _Verbalizers.of(member, n_classes).classes
    for n, i in enumerate(index):
        prompt = list(member.prefix[:-1]) + rows.segment(member, int(i)).tolist()
        scores = torch.zeros(len(member.verbalizers))
        first = None
        for v, ids in enumerate(member.verbalizers):
            if len(ids) == 1 and first is not None:
                scores[v] = first[ids[0]]
                continue
            inputs = torch.tensor([prompt + ids[:-1]], dtype=torch.long, device=device)
            with autocast(device):
                logits = model(input_ids=inputs, logits_to_keep=len(ids)).logits[0].float().cpu()
            logp = torch.log_softmax(logits, dim=-1)
            if first is None or len(ids) == 1:
                first = logp[0]
            scores[v] = logp[torch.arange(len(ids)), torch.tensor(ids)].sum()
        out[n] = _class_scores(scores[None], classes)[0].numpy()
    return out


def content_free_probs(
    model, tokenizer, member: Member, inputs: list[str], n_classes: int, *, pairs: bool, max_length: int, device
) -> np.ndarray:
    """The member's class probabilities [C] for content-free inputs (each as the row's text, and its pair), averaged
    over ``inputs`` (Zhao et al. 2021)."""
    rows = encode_rows(
        tokenizer,
        inputs,
        inputs if pairs else None,
        text_space=member.text_space,
        pair_space=member.pair_space,
        max_length=max_length,
    )
    batch = Batches.cut(np.arange(len(inputs)), len(inputs))
    scores = member_log_scores(model, member, rows, batch, n_classes, device=device, pad_id=_pad_id(tokenizer))
    return torch.softmax(torch.from_numpy(scores).double(), dim=-1).mean(0).numpy()


def calibrated(log_probs: np.ndarray, content_free: np.ndarray) -> np.ndarray:
    """Content-free calibration (Zhao et al. 2021): log-probabilities [..., C] of p / p_cf, renormalised."""
    shifted = torch.from_numpy(np.asarray(log_probs, np.float64)) - torch.log(torch.from_numpy(content_free))
    return torch.log_softmax(shifted, dim=-1).numpy()


def ensemble_signals(member_log_probs: np.ndarray) -> dict[str, np.ndarray]:
    """What the ``logits`` and ``mc`` signals hold, from the members' log-probabilities [K, N, C]: ``logits`` the
    log of the members' mean probability (its softmax is that mean), and the mean and per-row scores of
    :func:`kdpipe.signals.mc_dropout.summarise` over the members, as over MC-dropout samples."""
    log_probs = torch.from_numpy(np.asarray(member_log_probs, np.float64))
    logits = torch.logsumexp(log_probs, dim=0) - math.log(log_probs.shape[0])
    return {"logits": logits.float().numpy(), **summarise(log_probs.exp().float())}


def _pad_id(tokenizer) -> int:
    return int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)


@dataclass
class PromptPass:
    """A prompted teacher's pass over a split (or a shard of it): ``log_probs`` [K, N, C] of every member (calibrated
    when set), filled at ``rows`` (positions in the split); the few-shot rows each member read; the content-free
    probabilities [K, C] of a calibrated pass."""

    settings: PromptSettings
    split: str
    classes: list[str]
    member_names: list[str]
    row_ids: np.ndarray
    rows: np.ndarray
    log_probs: np.ndarray
    shots: dict[str, list[int]]
    content_free: np.ndarray | None
    model: dict  # the imported model folder's manifest, without its checksums
    pooled: np.ndarray | None = None  # [N, H] each row's mean last-layer state in the first member's prompt

    @property
    def gold_labels(self) -> dict:
        """The gold labels the pass read, as ``{split: rows}``: the train rows of the few-shot examples (none for a
        zero-shot teacher), and what the model read before kdpipe (``checkpoint``)."""
        read = sorted({r for rows in self.shots.values() for r in rows})
        return {**({"train": len(read)} if read else {}), **(self.model.get("gold_labels") or {})}


def score_split(
    settings: PromptPassSettings,
    model_dir: str | Path,
    data_dir: str | Path,
    *,
    shard: tuple[int, int] = WHOLE,
    shots_dir: str | Path | None = None,
    where: str = "prompt",
    device: torch.device | None = None,
) -> PromptPass:
    """A prompted teacher's pass over ``settings.split`` of ``data_dir`` (shard ``(k, S)`` of it), scoring the
    teacher's ``classes`` (in the dataset's order) with its ``prompt`` settings, ``batch_size`` rows at a time. The
    few-shot examples come from the train split of ``shots_dir`` (the dataset artifact; ``data_dir`` by default,
    which differs for the transfer rows). The prompt is checked again against the split (sentence pairs) and the
    tokenizer's checks run before the weights are loaded."""
    model_dir, data_dir = Path(model_dir), Path(data_dir)
    shots_dir = Path(shots_dir) if shots_dir is not None else data_dir
    manifest = check_causal_lm_folder(model_dir)
    split, batch_size = settings.split, settings.batch_size
    classes = list(settings.classes or read_labels(shots_dir))
    frame = read_split(data_dir, split)
    pairs = "text_pair" in frame.columns
    settings = typed(settings.prompt.to_dict(), classes=classes, pairs=pairs, where=where)
    tokenizer = load_causal_lm_tokenizer(model_dir)
    shots_frame = None
    if settings.shots:
        shots_frame = read_split(shots_dir, "train")
        shots_frame = shots_frame[shots_frame["label"].isin(classes)].reset_index(drop=True)
    prepared = prepare_members(settings, tokenizer, classes, pairs=pairs, shots_frame=shots_frame, where=where)
    device = device or pick_device()
    model = load_causal_lm(model_dir, device, check=False)
    encoded = {  # the rows tokenised once for each way a member's prompt leads into the text (usually one)
        key: encode_rows(
            tokenizer,
            frame["text"],
            frame["text_pair"] if pairs else None,
            text_space=key[0],
            pair_space=key[1],
            max_length=settings.max_length,
        )
        for key in dict.fromkeys((m.text_space, m.pair_space) for m in prepared)
    }
    row_ids = frame["row_id"].to_numpy()
    del frame, shots_frame  # (the texts, once tokenised: memory flat in N)
    release_freed_memory()

    def rows_of(member):
        return encoded[(member.text_space, member.pair_space)]

    batches = shard_batches(inference_batches(rows_of(prepared[0]).lengths(prepared[0]), batch_size), shard)
    log_probs = np.zeros((len(prepared), len(row_ids), len(classes)), dtype=np.float32)
    pooled = np.zeros((len(row_ids), int(model.config.hidden_size)), dtype=np.float32)
    content_free = np.zeros((len(prepared), len(classes))) if settings.calibrate else None
    for k, member in enumerate(prepared):
        scores = member_log_scores(
            model,
            member,
            rows_of(member),
            batches,
            len(classes),
            device=device,
            pad_id=_pad_id(tokenizer),
            desc=f"prompt {split} {member.name} ({k + 1}/{len(prepared)})",
            where=where,
            pooled=pooled if k == 0 else None,  # (the row's states in the first member's prompt)
        )
        member_log_probs = torch.log_softmax(torch.from_numpy(scores).double(), dim=-1).numpy()
        if content_free is not None:
            content_free[k] = content_free_probs(
                model,
                tokenizer,
                member,
                list(settings.calibrate),
                len(classes),
                pairs=pairs,
                max_length=settings.max_length,
                device=device,
            )
            member_log_probs = calibrated(member_log_probs, content_free[k])
        log_probs[k] = member_log_probs
    return PromptPass(
        settings=settings,
        split=split,
        classes=classes,
        member_names=[m.name for m in prepared],
        row_ids=row_ids,
        rows=shard_rows(list(batches)),
        log_probs=log_probs,
        shots={m.name: m.shot_rows for m in prepared},
        content_free=content_free,
        model={k: v for k, v in manifest.items() if k != "checksums"},
        pooled=pooled,
    )


def _meta(result: PromptPass) -> dict:
    """What every signal's manifest records of the pass (the same in every shard's part)."""
    return {
        "rows": len(result.row_ids),
        "labels": result.classes,
        "teacher": {"prompt": result.settings.to_dict(), "model": result.model.get("source")},
        "parameters": result.model.get("parameters"),
        "ensemble": "prompt",  # the members are prompts, not MC-dropout samples (docs/methods.md §7)
        "members": result.member_names,
        "shots": result.shots,
        "content_free": None if result.content_free is None else result.content_free.round(8).tolist(),
        "gold_labels": result.gold_labels,
    }


def write_part(result: PromptPass, part: str | Path) -> None:
    """The pass's part folder: ``logits/`` (row_id, logits), ``mc/`` (row_id, mean and every score of
    :data:`kdpipe.signals.mc_dropout.SCORES`), ``pooled/`` (row_id, pooled [n, H]) and ``prompt/`` (row_id,
    members [n, K, C]), each with its rows and ``part.json``."""
    rows, meta = result.rows, _meta(result)
    signals = ensemble_signals(result.log_probs[:, rows])
    arrays = {
        "logits": {"logits": signals["logits"]},
        "mc": {"mean": signals["mean"], **{key: signals[key] for key in SCORES}},
        "pooled": {"pooled": result.pooled[rows]},
        "prompt": {"members": np.exp(result.log_probs[:, rows]).transpose(1, 0, 2).astype(np.float32)},
    }
    for name, values in arrays.items():
        folder = Path(part) / name
        folder.mkdir(parents=True, exist_ok=True)
        np.save(folder / "row_id.npy", result.row_ids[rows])
        for key, array in values.items():
            np.save(folder / f"{key}.npy", np.asarray(array, dtype=np.float32))
        extra = {"hidden_size": int(result.pooled.shape[1])} if name == "pooled" else {}
        finish_part(folder, rows, {**meta, **extra})


def run_shard(
    settings: PromptPassSettings,
    model: str | Path,
    data: str | Path,
    shard: str,
    out_part: str | Path,
    shots: str | Path | None = None,
    *,
    where: str = "prompt",
) -> None:
    """One shard (``"k-of-S"``) of a prompted teacher's pass (:func:`score_split`) with the imported model folder
    ``model`` over the split of ``data`` (the few-shot examples from the train split of ``shots``, by default
    ``data``), written atomically as a part folder (:func:`write_part`)."""
    with atomic_path(out_part, directory=True) as tmp:
        result = score_split(settings, model, data, shard=parse_shard(shard), shots_dir=shots, where=where)
        write_part(result, tmp)


def run_pass(
    settings: PromptPassSettings,
    model: str | Path,
    data: str | Path,
    out: str | Path,
    shots: str | Path | None = None,
    *,
    where: str = "prompt",
) -> dict[str, dict]:
    """A prompted teacher's whole pass in one job: its ``logits`` and ``mc`` artifacts and ``prompt.npy`` in the
    signal folder ``out`` (:func:`gather`: the same bytes as any number of shards); returns the manifest of each."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with scratch_folder(out / "pass") as tmp:
        part = tmp / "part"
        run_shard(settings, model, data, "1-of-1", part, shots, where=where)
        return gather(settings, [part], out)
