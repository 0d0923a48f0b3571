"""Tiny Hugging Face models with their own tokenizers, built in-process (no download) and saved as model folders
that a config names as a ``backbone`` or a ``checkpoint``."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoModelForSequenceClassification, PreTrainedTokenizerFast, RobertaConfig

from kdpipe.data.prepare import _read_bbc_news
from kdpipe.models.loading import label_maps

BPE_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def byte_level_bpe(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (RoBERTa / GPT-2 style) trained on a few hundred BBC articles."""
    texts = _read_bbc_news()[0]["text"].iloc[::8].tolist()
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BPE_SPECIALS))
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


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
