"""Tiny Hugging Face models with their own tokenizers, built in-process (no download) and saved as model folders
that a config names as a ``backbone`` or a ``checkpoint``."""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoModelForSequenceClassification, DistilBertConfig, PreTrainedTokenizerFast, RobertaConfig

from kdpipe.data.prepare import _read_bbc_news
from kdpipe.models.loading import label_maps

BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@functools.cache
def _trained_bpe(vocab_size: int) -> Tokenizer:
    """A byte-level BPE (RoBERTa / GPT-2 style) trained on a few hundred BBC articles, once per session."""
    texts = _read_bbc_news()["text"].iloc[::8].tolist()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BPE_SPECIALS))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def byte_level_bpe(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer with RoBERTa's special tokens (``<s>`` 0, ``<pad>`` 1, ``</s>`` 2)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_bpe(vocab_size).to_str()),
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


@functools.cache
def _trained_wordpiece(vocab_size: int) -> Tokenizer:
    """A lower-cased WordPiece (BERT / DistilBERT style) trained on a few hundred BBC articles, once per session."""
    texts = _read_bbc_news()["text"].iloc[::8].tolist()
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=WORDPIECE_SPECIALS))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    return tok


def wordpiece(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer with BERT's special tokens (``[PAD]`` 0), making no token type ids (as DistilBERT's)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained_wordpiece(vocab_size).to_str()),
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_input_names=["input_ids", "attention_mask"],
    )


def tiny_distilbert(folder: Path, labels: list[str], *, layers: int = 2, heads: int = 2, seed: int = 0) -> Path:
    """A ``layers``-layer DistilBERT sequence classifier over ``labels`` (random weights, hidden size 32, ``heads``
    heads) with a WordPiece tokenizer, saved to ``folder`` as a fine-tuned checkpoint is."""
    tokenizer = wordpiece()
    config = DistilBertConfig(
        vocab_size=len(tokenizer),
        dim=32,
        hidden_dim=64,
        n_layers=layers,
        n_heads=heads,
        max_position_embeddings=130,
        pad_token_id=tokenizer.pad_token_id,
        **label_maps(labels),
    )
    config.architectures = ["DistilBertForSequenceClassification"]
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_roberta(folder: Path, labels: list[str] | None = None, *, seed: int = 0) -> Path:
    """A 2-layer RoBERTa with a byte-level BPE tokenizer, saved to ``folder``: a backbone, or with ``labels`` a
    fine-tuned-looking sequence classifier over them (random weights)."""
    tokenizer = byte_level_bpe()
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        **(label_maps(labels) if labels else {}),
    )
    if labels:
        config.architectures = ["RobertaForSequenceClassification"]
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def family_config(family: str, vocab_size: int, layers: int = 3):
    """A tiny random config of a Hugging Face family: hidden size 32, 2 heads, ``layers`` layers."""
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=130,
    )
    special = {
        "distilbert": dict(dim=32, n_layers=layers, n_heads=2, hidden_dim=64, max_position_embeddings=130),
        "gpt2": dict(n_embd=32, n_layer=layers, n_head=2, n_positions=130),
        "electra": dict(**common, embedding_size=32),
        "llama": dict(**common, num_key_value_heads=2),
        "qwen2": dict(**common, num_key_value_heads=2),
        "roberta": dict(**common, pad_token_id=1),
        "modernbert": dict(**common, pad_token_id=1, bos_token_id=0, eos_token_id=2, cls_token_id=0, sep_token_id=2),
    }
    kwargs = special.get(family, common)
    if family == "distilbert":
        kwargs = dict(vocab_size=vocab_size, **kwargs)
    if family == "gpt2":
        kwargs = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=2, **kwargs)
    return AutoConfig.for_model(family, **kwargs)


def tiny_family(folder: Path, family: str, *, pad: bool = True, seed: int = 0) -> Path:
    """A 3-layer random ``family`` backbone (a base model, no head) with a byte-level BPE tokenizer, saved to
    ``folder``; ``pad=False`` saves the tokenizer without a padding token, as decoder-only models often ship."""
    from transformers import AutoModel

    tokenizer = byte_level_bpe()
    if not pad:
        tokenizer.pad_token = None
    torch.manual_seed(seed)
    AutoModel.from_config(family_config(family, len(tokenizer))).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
