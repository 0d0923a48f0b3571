"""The feature signals: token-level teacher states of one split, for methods that align with them.

``hidden`` (hidden states of the chosen layers, 0 = embeddings), ``attentions`` (attention probabilities of the
chosen layers, 1-based, every head) and ``attentions_mean`` (their mean over heads), stored packed
(:mod:`kdpipe.signals.packed`; docs/design.md, "Feature dumps and their size"). Attentions need eager attention:
under SDPA transformers returns none without error, so the shapes are checked here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdpipe.core.checksums import write_manifest
from kdpipe.core.store import ArtifactError, atomic_path, ensure_disk_space, make_manifest
from kdpipe.models.inference import pass_batches
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.forward import forward
from kdpipe.signals.packed import LAYOUT, TOKENS, item_shape, offsets_of, pack_rows, row_counts, sidecar
from kdpipe.signals.parts import gather_packed, shard_rows
from kdpipe.signals.rowfile import RowFile
from kdpipe.signals.settings import SignalSettings
from kdpipe.signals.teacher import TeacherPass


def dump_bytes(feature: str, layers: int, hidden_size: int, heads: int, lengths: np.ndarray) -> int:
    """float16 bytes of rows of ``lengths`` tokens in a packed dump of ``layers`` layers."""
    per_entry = 2 * int(np.prod(item_shape(feature, layers, hidden_size), dtype=np.int64))
    return per_entry * int(row_counts(feature, lengths, layers, heads).sum())


def selected_states(outputs, feature: str, layers: list[int]) -> torch.Tensor:
    """The ``layers`` of a model's outputs stacked on dimension 1: hidden states [B, L, S, H] (0 = embeddings),
    attentions [B, L, heads, S, S] (1-based) or their mean over heads [B, L, S, S] (float32)."""
    states = outputs.hidden_states if feature == "hidden" else outputs.attentions
    needed = max(layers) + 1 if feature == "hidden" else max(layers)
    if not states or len(states) < needed:
        raise ArtifactError(
            f"the model returned {len(states or ())} {feature} tensors, {needed} needed "
            "(attentions need attn_implementation='eager')"
        )
    pick = [states[l] if feature == "hidden" else states[l - 1] for l in layers]
    stacked = torch.stack(pick, 1)
    return stacked.float().mean(2) if feature == "attentions_mean" else stacked


class FeatureCollector:
    """The shard's rows of the feature into the part folder, packed in split order as the forward's batches come,
    each cut to its own length (nothing depends on the batch's padding); every row's length and token hash beside."""

    def __init__(self, settings: SignalSettings, teacher: TeacherPass, rows: np.ndarray, part: Path, device) -> None:
        feature, layers = settings.signal, list(settings.layers)
        config, lengths = teacher.model.config, teacher.encoded.lengths
        self.feature, self.layers, self.lengths, self.heads = feature, layers, lengths, config.num_attention_heads
        self.teacher, self.part, self.name = teacher, part, f"{feature}.npy"
        counts = row_counts(feature, lengths[rows], len(layers), self.heads)
        self.starts = np.full(len(lengths), -1, dtype=np.int64)
        self.starts[rows] = offsets_of(counts)[:-1]
        ensure_disk_space(
            part / self.name,
            dump_bytes(feature, len(layers), config.hidden_size, self.heads, lengths[rows]),
            f"the {feature} dump ({len(rows)} rows, {int(lengths[rows].sum()):,} tokens)",
        )
        shape = (int(counts.sum()), *item_shape(feature, len(layers), config.hidden_size))
        self.array = RowFile.create(part / self.name, shape, np.float16)
        self.hidden_states, self.attentions = feature == "hidden", feature != "hidden"

    def add(self, batch: dict, outputs) -> None:
        values = selected_states(outputs, self.feature, self.layers).to(torch.float16).cpu().numpy()
        if self.feature == "attentions" and values.shape[2] != self.heads:
            raise ArtifactError(f"the model returned {values.shape[2]} attention heads, its config says {self.heads}")
        index = batch["index"].cpu().numpy()
        for i, block in zip(index, pack_rows(self.feature, values, self.lengths[index])):
            self.array.write_at(int(self.starts[i]), block)

    def finish(self) -> dict:
        self.array.close()
        encoded, config = self.teacher.encoded, self.teacher.model.config
        tokens = np.zeros(len(encoded), dtype=TOKENS)
        tokens["length"], tokens["token_hash"] = encoded.lengths, encoded.token_hashes
        np.save(self.part / sidecar(self.name, "tokens"), tokens)
        return {
            "rows": len(encoded),
            "labels": self.teacher.labels,
            "layers": self.layers,
            "hidden_size": config.hidden_size,
            "heads": config.num_attention_heads,
        }


collector = FeatureCollector  # what the forward pass asks this module for (kdpipe.signals.forward)


def dump_feature(
    model, encoded, feature: str, layers: list[int], out_npy: Path, *, batch_size: int, device: torch.device
) -> np.ndarray:
    """Write the feature of every row of ``encoded`` packed in split order to ``out_npy`` (``<feature>.npy``, without
    sidecars) as a signal pass does; returns the row positions."""
    out_npy = Path(out_npy)
    if out_npy.name != f"{feature}.npy":
        raise ValueError(f"{out_npy}: a {feature} dump is named {feature}.npy")
    rows = shard_rows(pass_batches(encoded, batch_size))
    settings = SignalSettings(signal=feature, split="", batch_size=batch_size, layers=tuple(layers))
    teacher = TeacherPass(model, encoded, [], {}, Path(), Path())  # (the collector reads its model and rows only)
    writer = FeatureCollector(settings, teacher, rows, out_npy.parent, device)
    forward(model, encoded, [writer], batch_size=batch_size, device=device, desc=f"dump {feature}")
    writer.array.close()
    return rows


def write(settings: SignalSettings, meta: dict, parts, out_dir: Path) -> dict:
    """The packed ``<feature>.npy``, its sidecars and manifest in ``out_dir`` from every shard's part."""
    feature = settings.signal
    data_file, offsets_file, tokens_file, manifest_file = (out_dir / name for name in SIGNALS[feature].files)
    tokens = np.load(parts[0][1] / tokens_file.name)
    for _, folder in parts[1:]:
        if not np.array_equal(np.load(folder / tokens_file.name), tokens):
            raise ArtifactError(f"{folder}: shard tokenised the split otherwise than {parts[0][1]}; rerun the shards")
    layers, heads = meta["layers"], meta["heads"]
    offsets = offsets_of(row_counts(feature, tokens["length"], len(layers), heads))
    nbytes = dump_bytes(feature, len(layers), meta["hidden_size"], heads, tokens["length"])
    ensure_disk_space(
        data_file, nbytes, f"the gathered {feature} dump ({meta['rows']} rows, {int(tokens['length'].sum()):,} tokens)"
    )
    with atomic_path(data_file) as tmp:
        gather_packed(parts, feature, offsets, out=tmp)
    for path, array in ((offsets_file, offsets), (tokens_file, tokens)):
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.save(fh, array)
    manifest = make_manifest(
        feature,
        config=settings,
        split=settings.split,
        layout=LAYOUT,
        **meta,
        tokens=int(tokens["length"].sum()),
        max_tokens=int(tokens["length"].max(initial=0)),
        bytes=nbytes,
        bytes_per_example=round(nbytes / max(meta["rows"], 1)),
    )
    return write_manifest(manifest_file, manifest, [p.name for p in (data_file, offsets_file, tokens_file)])
