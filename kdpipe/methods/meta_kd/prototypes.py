"""The ``prototypes`` stage: Meta-KD's per-example prototype scores (docs/methods.md §4).

How transferable a training example looks, from the **un-fine-tuned** backbone: t_i averages the cosine of the
row's token-mean embedding to its own domain's prototype and to the mean of the other domains'. Output:
``train.parquet`` (row_id, domain, label, score) and ``train.json``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from numpy.lib.format import open_memmap

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast, pick_device
from kdpipe.core.store import KdpipeError, atomic_path, make_manifest
from kdpipe.data.batching import encode_frame, model_inputs
from kdpipe.data.dataset import domain_ids, read_domains, read_labels, read_split
from kdpipe.methods.meta_kd.branch import token_mean
from kdpipe.methods.meta_kd.settings import PrototypeSettings
from kdpipe.models.inference import iterate
from kdpipe.models.loading import load_encoder, load_tokenizer
from kdpipe.signals.io import manifest_path


def prototypes(
    embeddings: np.ndarray, domains: np.ndarray, classes: np.ndarray, n_domains: int, n_classes: int, by: str
) -> tuple[np.ndarray, np.ndarray]:
    """(prototypes [K, C', H], row counts [K, C']): the mean embedding per (domain, class) (C' = C) or per domain
    (``by="domain"``, C' = 1; the schema allows no other). Summed in chunks: ``embeddings`` may be a memmap."""
    groups = classes if by == "domain_class" else np.zeros_like(classes)
    width = n_classes if by == "domain_class" else 1
    sums = np.zeros((n_domains, width, embeddings.shape[1]), dtype=np.float64)
    counts = np.zeros((n_domains, width), dtype=np.int64)
    for start in range(0, len(embeddings), 4096):
        chunk = slice(start, start + 4096)
        np.add.at(sums, (domains[chunk], groups[chunk]), np.asarray(embeddings[chunk], dtype=np.float64))
        np.add.at(counts, (domains[chunk], groups[chunk]), 1)
    return sums / np.maximum(counts, 1)[..., None], counts


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(norms, 1e-12)


def prototype_scores(
    embeddings: np.ndarray, domains: np.ndarray, classes: np.ndarray, protos: np.ndarray, counts: np.ndarray, by: str
) -> tuple[np.ndarray, np.ndarray]:
    """(t [N], has_other [N]): t_i = ½[cos(e_i, c_own) + cos(e_i, mean of the other domains' prototypes)], or the
    first cosine alone where no other domain has a prototype for the row's group (``has_other`` False)."""
    groups = classes if by == "domain_class" else np.zeros_like(classes)
    present = counts > 0  # [K, C']
    # sum and number of the prototypes of each group over all domains; a row's "others" leave its own domain out
    total = (protos * present[..., None]).sum(0)  # [C', H]
    number = present.sum(0)  # [C']
    scores = np.empty(len(embeddings), dtype=np.float64)
    has_other = np.empty(len(embeddings), dtype=bool)
    for start in range(0, len(embeddings), 4096):
        chunk = slice(start, start + 4096)
        e = np.asarray(embeddings[chunk], dtype=np.float64)
        d, g = domains[chunk], groups[chunk]
        own = protos[d, g]
        others = number[g] - 1
        other_mean = (total[g] - own) / np.maximum(others, 1)[:, None]
        own_cos = _cosine(e, own)
        scores[chunk] = np.where(others > 0, 0.5 * (own_cos + _cosine(e, other_mean)), own_cos)
        has_other[chunk] = others > 0
    return scores, has_other


@torch.inference_mode()
def _embed(backbone: str, max_length: int, batch_size: int, frame: pd.DataFrame, out: Path) -> np.ndarray:
    """e_i of every row of ``frame`` under ``backbone``, into a float32 memmap at ``out``."""
    device = pick_device()
    model = load_encoder(backbone).to(device).eval()
    encoded = encode_frame(load_tokenizer(backbone), frame, max_length=max_length)
    emb = open_memmap(out, mode="w+", dtype=np.float32, shape=(len(frame), model.config.hidden_size))
    for batch in iterate(encoded, batch_size, device, desc="prototype embeddings"):
        with autocast(device):
            hidden = model(**model_inputs(batch)).last_hidden_state
        mask = batch["attention_mask"].clone()
        mask[:, 0] = 0  # [CLS] is left out
        emb[batch["index"].cpu().numpy()] = token_mean(hidden.float(), mask).cpu().numpy()
    emb.flush()
    return emb


def write_prototype_scores(settings: PrototypeSettings, data: Path, out: Path) -> dict:
    """Score every train row of the dataset ``data`` against the prototypes of ``settings``; write ``out``."""
    data_dir, out_parquet = Path(data), Path(out)
    by = settings.by
    domains = read_domains(data_dir, "prototypes (Meta-KD)")
    if len(domains) < 2:
        raise KdpipeError(f"prototypes (Meta-KD) need at least 2 domains; the data has {domains}")
    labels = read_labels(data_dir)
    frame = read_split(data_dir, "train")
    d, y = domain_ids(frame, domains), frame["label_id"].to_numpy()
    out_parquet.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out_parquet.parent, prefix=".embeddings-") as tmp:
        emb = _embed(settings.backbone, settings.max_length, settings.batch_size, frame, Path(tmp) / "embeddings.npy")
        protos, counts = prototypes(emb, d, y, len(domains), len(labels), by)
        scores, has_other = prototype_scores(emb, d, y, protos, counts, by)
        del emb
    table = pd.DataFrame(
        {
            "row_id": frame["row_id"].to_numpy(),
            "domain": frame["domain"].to_numpy(),
            "label": frame["label"].to_numpy(),
            "score": scores.astype(np.float32),
        }
    )
    with atomic_path(out_parquet) as tmp:
        table.to_parquet(tmp, index=False)
    manifest = make_manifest(
        "prototypes",
        config=settings,
        split="train",
        rows=len(frame),
        domains=domains,
        labels=labels,
        rows_without_other_domain=int((~has_other).sum()),
        score_mean=float(scores.mean()),
        score_std=float(scores.std()),
    )
    return write_manifest(manifest_path(out_parquet), manifest, [out_parquet.name])
