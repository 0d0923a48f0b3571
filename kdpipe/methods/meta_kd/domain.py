"""The ``domain`` signal: a meta-teacher's per-example Meta-KD signals on one split (docs/methods.md §4).

- ``domain.npy``: the domain representation g_t = W_g(E_dom[d_i] + ē_i) of every row
(``kdpipe.methods.meta_kd.branch``),
  float16 [N, H_t], written through ``open_memmap`` (memory flat in N);
- ``domain.parquet``: row_id, p_gold = p_T(y_i | x_i) (eval mode, T = 1) and the domain-expertise weight
  w_i = 1 / (1 + exp((1 − p_gold)²)), which lies in [0.27, 0.5]: the teacher's confidence in the gold label;
- ``domain.json``: the manifest (rows, labels, domains, hidden size).

Runs as S shards gathered into the same bytes as one pass (:mod:`kdpipe.signals.shards`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from numpy.lib.format import open_memmap

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast, pick_device
from kdpipe.core.store import KdpipeError, atomic_path, ensure_disk_space, make_manifest
from kdpipe.data.batching import model_inputs
from kdpipe.data.dataset import domain_ids, read_domains, read_split
from kdpipe.methods.meta_kd.branch import load_branch
from kdpipe.models.inference import iterate, pass_batches
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.shards import gather_array, shard_rows
from kdpipe.signals.teacher import open_teacher


def expertise_weight(p_gold: np.ndarray | torch.Tensor):
    """w_i = 1 / (1 + exp((1 − p_T(y_i|x_i))²)) (§4): 0.5 for a certain, right teacher, 1/(1 + e) ≈ 0.27 for one
    that gives the gold label no mass."""
    lib = torch if isinstance(p_gold, torch.Tensor) else np
    return 1.0 / (1.0 + lib.exp((1.0 - p_gold) ** 2))


def _gold_ids(teacher_labels: list[str], frame: pd.DataFrame) -> np.ndarray:
    local = {c: i for i, c in enumerate(teacher_labels)}
    missing = sorted(set(frame["label"]) - set(local))
    if missing:
        raise KdpipeError(
            f"dump_domain: the teacher predicts {teacher_labels}, but the split has label "
            f"{missing[0]!r}; Meta-KD's meta-teacher must cover every class (classes: null)"
        )
    return frame["label"].map(local).to_numpy(dtype=np.int64)


@torch.inference_mode()
def compute(params: dict, teacher_dir: Path, data_dir: Path, shard: tuple[int, int], part: Path):
    """One shard of the pass into the part folder ``part``: domain.npy (written straight into it), p_gold.npy and
    row_id.npy; returns (rows, manifest fields)."""
    device = pick_device()
    teacher = open_teacher(teacher_dir, data_dir, params["split"])
    model = teacher.model.to(device).eval()
    branch = load_branch(teacher_dir).to(device)
    frame = read_split(data_dir, params["split"])
    domains = read_domains(data_dir, "dump_domain (Meta-KD)")
    if branch.domains != domains:
        raise KdpipeError(f"{teacher_dir}: its domain branch knows domains {branch.domains}, the data has {domains}")
    d = torch.as_tensor(domain_ids(frame, domains), device=device)
    y = torch.as_tensor(_gold_ids(teacher.labels, frame), device=device)
    rows = shard_rows(pass_batches(teacher.encoded, params["batch_size"], shard))
    position = np.full(len(frame), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    hidden = model.config.hidden_size
    ensure_disk_space(part / "domain.npy", 2 * len(rows) * hidden, f"the domain dump ({len(rows)} rows)")
    g_out = open_memmap(part / "domain.npy", mode="w+", dtype=np.float16, shape=(len(rows), hidden))
    p_gold = np.zeros(len(rows), dtype=np.float32)
    for batch in iterate(teacher.encoded, params["batch_size"], device, desc="dump domain", shard=shard):
        index = batch["index"]
        with autocast(device):
            out = model(**model_inputs(batch), output_hidden_states=True)
            g = branch.representation(out.hidden_states[-1], batch["attention_mask"], d[index])
        local = position[index.cpu().numpy()]
        g_out[local] = g.to(torch.float16).cpu().numpy()
        probs = torch.softmax(out.logits.float(), -1)
        p_gold[local] = probs.gather(1, y[index][:, None])[:, 0].cpu().numpy()
    g_out.flush()
    del g_out
    np.save(part / "p_gold.npy", p_gold)
    np.save(part / "row_id.npy", teacher.encoded.row_ids[rows])
    return rows, {
        "rows": len(frame),
        "labels": teacher.labels,
        "domains": domains,
        "hidden_size": hidden,
        "teacher": teacher.teacher_config,
    }


def write(params: dict, meta: dict, parts, out_dir: Path) -> dict:
    """``domain.npy``, ``domain.parquet`` and ``domain.json`` in ``out_dir`` from the parts of every shard."""
    npy, parquet, manifest_file = (out_dir / name for name in SIGNALS["domain"].files)
    ensure_disk_space(npy, 2 * meta["rows"] * meta["hidden_size"], f"the gathered domain dump ({meta['rows']} rows)")
    with atomic_path(npy) as tmp:
        gather_array(parts, "domain", meta["rows"], out=tmp)
    p_gold = gather_array(parts, "p_gold", meta["rows"])
    table = pd.DataFrame(
        {
            "row_id": gather_array(parts, "row_id", meta["rows"]),
            "p_gold": p_gold,
            "expertise": expertise_weight(p_gold).astype(np.float32),
        }
    )
    with atomic_path(parquet) as tmp:
        table.to_parquet(tmp, index=False)
    manifest = make_manifest("domain", config=params, split=params["split"], **meta)
    return write_manifest(manifest_file, manifest, [npy.name, parquet.name])
