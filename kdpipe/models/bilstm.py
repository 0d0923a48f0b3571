"""The BiLSTM student of ProKT's text experiments (docs/methods.md §5), trained from scratch.

Embedding → dropout → one bidirectional LSTM layer → max-pooling over the real tokens; a sentence pair's two sides
are encoded apart and combined as [u; v; |u − v|; u ∘ v]; then Linear + ReLU + dropout and the classifier (sizes
after ProKT's README). It reads a Hugging Face tokenizer's ids, takes the transformer students' batch keys (plus
``pair_input_ids`` / ``pair_attention_mask``) and returns ``.logits``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence
from transformers.modeling_outputs import SequenceClassifierOutput

from kdpipe.models.loading import save_kdpipe_model

BILSTM_FILE = "bilstm.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass
class BiLSTMConfig:
    vocab_size: int
    num_labels: int
    pad_token_id: int = 0
    embedding_dim: int = 300
    hidden_size: int = 300  # per direction
    fc_size: int = 600
    dropout: float = 0.4
    pairs: bool = False  # sentence pairs, each side encoded separately
    id2label: dict = field(default_factory=dict)


class BiLSTMClassifier(nn.Module):
    separate_pairs = True  # the two sides of a pair are tokenised apart (kdpipe.data.batching.encode)

    def __init__(self, config: BiLSTMConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.embedding_dim, padding_idx=config.pad_token_id)
        self.dropout = nn.Dropout(config.dropout)
        self.lstm = nn.LSTM(config.embedding_dim, config.hidden_size, batch_first=True, bidirectional=True)
        features = 2 * config.hidden_size * (4 if config.pairs else 1)
        self.fc = nn.Linear(features, config.fc_size)
        self.classifier = nn.Linear(config.fc_size, config.num_labels)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Max-pooled BiLSTM states [B, 2h] of one side; padded positions are excluded from the max."""
        lengths = attention_mask.sum(1).clamp(min=1)
        emb = self.dropout(self.embeddings(input_ids))
        packed = pack_padded_sequence(emb, lengths.cpu(), batch_first=True, enforce_sorted=False)
        states, _ = pad_packed_sequence(self.lstm(packed)[0], batch_first=True, total_length=input_ids.shape[1])
        real = attention_mask[:, :, None].bool()
        return states.masked_fill(~real, torch.finfo(states.dtype).min).max(1).values

    def forward(
        self, input_ids, attention_mask, pair_input_ids=None, pair_attention_mask=None, **_ignored
    ) -> SequenceClassifierOutput:
        u = self.encode(input_ids, attention_mask)
        if self.config.pairs:
            if pair_input_ids is None:
                raise ValueError("this BiLSTM was built for sentence pairs: pass pair_input_ids")
            v = self.encode(pair_input_ids, pair_attention_mask)
            u = torch.cat([u, v, (u - v).abs(), u * v], dim=-1)
        hidden = self.dropout(torch.relu(self.fc(self.dropout(u))))
        return SequenceClassifierOutput(logits=self.classifier(hidden))

    def save_pretrained(self, out_dir, **_ignored) -> None:
        save_kdpipe_model(self, out_dir, "bilstm", json.dumps(asdict(self.config), indent=1))


def make_bilstm(tokenizer, labels: list[str], *, pairs: bool, seed: int, **sizes: float | None) -> BiLSTMClassifier:
    """A fresh BiLSTM over ``tokenizer``'s vocabulary; ``sizes``: :class:`BiLSTMConfig` fields (None: its default)."""
    torch.manual_seed(seed)
    config = BiLSTMConfig(
        vocab_size=len(tokenizer),
        num_labels=len(labels),
        pairs=pairs,
        pad_token_id=tokenizer.pad_token_id or 0,
        id2label=dict(enumerate(labels)),
        **{k: v for k, v in sizes.items() if v is not None},
    )
    return BiLSTMClassifier(config)


def load_bilstm(model_dir, *, attn: str | None = None) -> BiLSTMClassifier:
    """A BiLSTM written by :meth:`BiLSTMClassifier.save_pretrained` (``attn`` is ignored: it has no attention)."""
    config = json.loads((Path(model_dir) / BILSTM_FILE).read_text())
    config["id2label"] = {int(k): v for k, v in config["id2label"].items()}
    model = BiLSTMClassifier(BiLSTMConfig(**config))
    model.load_state_dict(load_file(str(Path(model_dir) / WEIGHTS_FILE)))
    return model
