"""The ``dump_domain`` stage: a meta-teacher's per-example Meta-KD signals on one split (METHODS.md §4, "What the
teacher provides"; issue 6).

- ``domain.npy``: the domain representation g_t = W_g(E_dom[d_i] + ē_i) of every row (``kdpipe.domain_branch``),
  float16 [N, H_t], written through ``open_memmap`` (memory flat in N);
- ``domain.parquet``: row_id, p_gold = p_T(y_i | x_i) (eval mode, T = 1) and the domain-expertise weight
  w_i = 1 / (1 + exp((1 − p_gold)²)), which lies in [0.27, 0.5]: the teacher's confidence in the gold label;
- ``domain.json``: the manifest (rows, labels, domains, hidden size).

Runs as S shards (``kdpipe.shards``) gathered into the same bytes as one pass.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from numpy.lib.format import open_memmap

from kdpipe.batching import model_inputs
from kdpipe.data import domain_ids, read_domains, read_split
from kdpipe.device import autocast, pick_device
from kdpipe.domain_branch import load_branch
from kdpipe.inference import iterate, pass_batches
from kdpipe.shards import finish_part, gather_array, parse_shard, read_parts, shard_rows
from kdpipe.signals import manifest_path
from kdpipe.store import KdpipeError, atomic_path, ensure_disk_space, make_manifest, write_json
from kdpipe.teacher_inputs import open_teacher


def expertise_weight(p_gold: np.ndarray | torch.Tensor):
    """w_i = 1 / (1 + exp((1 − p_T(y_i|x_i))²)) (§4): 0.5 for a certain, right teacher, 1/(1 + e) ≈ 0.27 for one
    that gives the gold label no mass."""
    lib = torch if isinstance(p_gold, torch.Tensor) else np
    return 1.0 / (1.0 + lib.exp((1.0 - p_gold) ** 2))


def _gold_ids(teacher_labels: list[str], frame: pd.DataFrame) -> np.ndarray:
    local = {c: i for i, c in enumerate(teacher_labels)}
    missing = sorted(set(frame["label"]) - set(local))
    if missing:
        raise KdpipeError(f"dump_domain: the teacher predicts {teacher_labels}, but the split has label "
                          f"{missing[0]!r}; Meta-KD's meta-teacher must cover every class (classes: null)")
    return frame["label"].map(local).to_numpy(dtype=np.int64)


@torch.inference_mode()
def run_shard(params: dict, teacher_dir: Path, data_dir: Path, shard: str, out_part: Path) -> None:
    """One shard (``"k-of-S"``) of the pass, as a part folder: domain.npy (written straight into it), p_gold.npy."""
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
    part = parse_shard(shard)
    rows = shard_rows(pass_batches(teacher.encoded, params["batch_size"], part))
    position = np.full(len(frame), -1, dtype=np.int64)
    position[rows] = np.arange(len(rows))
    hidden = model.config.hidden_size
    with atomic_path(out_part, directory=True) as tmp:
        ensure_disk_space(tmp / "domain.npy", 2 * len(rows) * hidden, f"the domain dump ({len(rows)} rows)")
        g_out = open_memmap(tmp / "domain.npy", mode="w+", dtype=np.float16, shape=(len(rows), hidden))
        p_gold = np.zeros(len(rows), dtype=np.float32)
        for batch in iterate(teacher.encoded, params["batch_size"], device, desc="dump domain", shard=part):
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
        np.save(tmp / "p_gold.npy", p_gold)
        np.save(tmp / "row_id.npy", teacher.encoded.row_ids[rows])
        finish_part(tmp, rows, {"rows": len(frame), "labels": teacher.labels, "domains": domains,
                                "hidden_size": hidden, "teacher": teacher.teacher_config})


def gather(params: dict, parts: list[Path], out_npy: Path) -> dict:
    """``domain.npy``, ``domain.parquet`` and ``domain.json`` from the parts of all shards."""
    meta, located = read_parts(parts)
    out_npy = Path(out_npy)
    ensure_disk_space(out_npy, 2 * meta["rows"] * meta["hidden_size"], f"the gathered domain dump ({meta['rows']} rows)")
    with atomic_path(out_npy) as tmp:
        gather_array(located, "domain", meta["rows"], out=tmp)
    p_gold = gather_array(located, "p_gold", meta["rows"])
    table = pd.DataFrame({"row_id": gather_array(located, "row_id", meta["rows"]), "p_gold": p_gold,
                          "expertise": expertise_weight(p_gold).astype(np.float32)})
    with atomic_path(out_npy.with_suffix(".parquet")) as tmp:
        table.to_parquet(tmp, index=False)
    manifest = make_manifest("domain", config=params, split=params["split"], **meta)
    write_json(manifest_path(out_npy), manifest)
    return manifest


def run(params: dict, teacher_dir: Path, data_dir: Path, out_npy: Path) -> dict:
    """The whole split in one pass (one shard, gathered)."""
    Path(out_npy).parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=Path(out_npy).parent) as tmp:
        part = Path(tmp) / "part"
        run_shard(params, teacher_dir, data_dir, "1-of-1", part)
        return gather(params, [part], out_npy)
