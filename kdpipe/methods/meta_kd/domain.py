"""The ``domain`` signal: a meta-teacher's per-example Meta-KD signals on one split (docs/methods.md §4).

``domain.npy`` holds the domain representation g_t of every row, float16 [N, H_t]; ``domain.parquet`` row_id,
p_gold = p_T(y_i | x_i) and the domain-expertise weight w_i; ``domain.json`` the manifest. Made by the teacher's
shared forward pass (:mod:`kdpipe.signals.forward`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from numpy.lib.format import open_memmap

from kdpipe.core.checksums import write_manifest
from kdpipe.core.device import autocast
from kdpipe.core.store import KdpipeError, atomic_path, ensure_disk_space, make_manifest
from kdpipe.data.dataset import domain_ids, read_domains, read_split
from kdpipe.methods.meta_kd.branch import load_branch
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.parts import gather_array
from kdpipe.signals.settings import SignalSettings
from kdpipe.signals.teacher import TeacherPass


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


class DomainCollector:
    """The shard's domain representations (written straight into the part folder: memory flat in N), gold-label
    probabilities and row ids, from the forward's last hidden layer and logits."""

    hidden_states, attentions = True, False

    def __init__(self, settings: SignalSettings, teacher: TeacherPass, rows: np.ndarray, part: Path, device) -> None:
        teacher_dir, data_dir = teacher.teacher_dir, teacher.data_dir
        self.teacher, self.rows, self.part, self.device = teacher, rows, part, device
        self.branch = load_branch(teacher_dir).to(device)
        frame = read_split(data_dir, settings.split)
        self.domains = read_domains(data_dir, "dump_domain (Meta-KD)")
        if self.branch.domains != self.domains:
            raise KdpipeError(
                f"{teacher_dir}: its domain branch knows domains {self.branch.domains}, the data has {self.domains}"
            )
        self.d = torch.as_tensor(domain_ids(frame, self.domains), device=device)
        self.y = torch.as_tensor(_gold_ids(teacher.labels, frame), device=device)
        self.position = np.full(len(frame), -1, dtype=np.int64)
        self.position[rows] = np.arange(len(rows))
        self.hidden = teacher.model.config.hidden_size
        ensure_disk_space(part / "domain.npy", 2 * len(rows) * self.hidden, f"the domain dump ({len(rows)} rows)")
        self.g_out = open_memmap(part / "domain.npy", mode="w+", dtype=np.float16, shape=(len(rows), self.hidden))
        self.p_gold = np.zeros(len(rows), dtype=np.float32)

    def add(self, batch: dict, outputs) -> None:
        index = batch["index"]
        with autocast(self.device):
            g = self.branch.representation(outputs.hidden_states[-1], batch["attention_mask"], self.d[index])
        local = self.position[index.cpu().numpy()]
        self.g_out[local] = g.to(torch.float16).cpu().numpy()
        probs = torch.softmax(outputs.logits.float(), -1)
        self.p_gold[local] = probs.gather(1, self.y[index][:, None])[:, 0].cpu().numpy()

    def finish(self) -> dict:
        self.g_out.flush()
        del self.g_out
        np.save(self.part / "p_gold.npy", self.p_gold)
        np.save(self.part / "row_id.npy", self.teacher.encoded.row_ids[self.rows])
        return {
            "rows": len(self.position),
            "labels": self.teacher.labels,
            "domains": self.domains,
            "hidden_size": self.hidden,
            "teacher": self.teacher.teacher_config,
        }


collector = DomainCollector  # what the forward pass asks this module for (kdpipe.signals.forward)


def write(settings: SignalSettings, meta: dict, parts, out_dir: Path) -> dict:
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
    manifest = make_manifest("domain", config=settings, split=settings.split, **meta)
    return write_manifest(manifest_file, manifest, [npy.name, parquet.name])
