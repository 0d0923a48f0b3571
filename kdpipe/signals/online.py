"""Token-level teacher signals computed inside the student job, for ``signals: online``
(docs/design.md, "Feature dumps and their size").

The student job runs the teacher (eval mode, no gradients) on each batch's rows, tokenised the teacher's way, and a
method reads the result as it reads a dump. The one exception to "a distill job never loads a teacher": the
teacher's folder is then an input of the student job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from kdpipe.core.device import autocast
from kdpipe.core.store import KdpipeError, read_json, read_manifest
from kdpipe.data.batching import collate, encode_frame, model_inputs
from kdpipe.models.loading import load_tokenizer, load_trained
from kdpipe.signals.features import selected_states


class OnlineTeacher:
    """A teacher run on the student's training rows a batch at a time, its last batch's outputs kept, so every layer
    and feature a step reads comes from one forward pass."""

    def __init__(self, model, encoded, device: torch.device, hidden: bool, attentions: bool):
        self.model, self.encoded, self.device = model.to(device).eval(), encoded, device
        self.hidden, self.attentions = hidden, attentions
        self._key, self._outputs, self._mask = None, None, None

    def outputs(self, index: np.ndarray):
        key = np.asarray(index, dtype=np.int64).tobytes()
        if key != self._key:
            batch = collate(self.encoded, np.asarray(index, dtype=np.int64), self.device)
            with torch.no_grad(), autocast(self.device):
                self._outputs = self.model(
                    **model_inputs(batch), output_hidden_states=self.hidden, output_attentions=self.attentions
                )
            self._key, self._mask = key, batch["attention_mask"].float()
        return self._outputs, self._mask


class OnlineFeature:
    """One feature of an :class:`OnlineTeacher`, read like a dump (:class:`kdpipe.signals.load.TokenFeature`)."""

    def __init__(self, teacher: OnlineTeacher, feature: str, layers: list[int]):
        self.teacher, self.feature, self.layers = teacher, feature, list(layers)
        self.lengths, self.token_hashes = teacher.encoded.lengths, teacher.encoded.token_hashes
        config = teacher.model.config
        self.hidden_size = config.hidden_size
        self.heads = config.num_attention_heads if feature == "attentions" else None

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, index: np.ndarray, slot: int, width: int, device: torch.device) -> torch.Tensor:
        """As :meth:`kdpipe.signals.load.TokenFeature.batch`: zero past each row's length, padded to ``width``."""
        outputs, mask = self.teacher.outputs(index)
        values = selected_states(outputs, self.feature, [self.layers[slot]])[:, 0].float()
        if self.feature == "hidden":
            values = values * mask[:, :, None]
            pad = (0, 0, 0, width - values.shape[1])
        else:
            square = mask[:, :, None] * mask[:, None, :]
            values = values * (square[:, None] if values.dim() == 4 else square)
            pad = (0, width - values.shape[-1], 0, width - values.shape[-2])
        return torch.nn.functional.pad(values, pad).to(device)


ONLINE = ("hidden", "attentions")  # the signals a student with ``signals: online`` computes itself


def online_signals(
    names: tuple[str, ...],
    teacher_dirs: list[Path],
    job,
    *,
    teachers: Sequence[str],
    alignment: Mapping[str, Sequence[Sequence[int]]] | None,
    attention_feature: str | None,
) -> dict[str, dict]:
    """Teacher -> its token-level signals among ``names`` (and ``labels``), as its cached dumps would give them,
    computed online on the student's training rows (``job.train`` then ``job.transfer``, with their texts)."""
    attention = attention_feature or "attentions"  # every head, or their mean (kdpipe.plan.layers)
    wanted = {n: attention if n == "attentions" else n for n in names if n in ONLINE}
    if not wanted:
        return {}
    frame = job.train if job.transfer is None else pd.concat([job.train, job.transfer], ignore_index=True)
    dirs = {Path(d).name: Path(d) for d in teacher_dirs}
    out = {}
    for name in teachers:
        if name not in dirs:
            raise KdpipeError(f"the student computes its teachers' token-level signals: pass --teachers .../{name}")
        pairs = alignment[name]
        layers = {"hidden": sorted({tl for _, tl in pairs}), "attentions": sorted({tl for s, tl in pairs if s >= 1})}
        manifest = read_manifest(dirs[name] / "manifest.json", kind="teacher")
        model = load_trained(dirs[name], attn="eager" if "attentions" in wanted else None)
        encoded = encode_frame(load_tokenizer(str(dirs[name])), frame, max_length=manifest["config"]["max_length"])
        teacher = OnlineTeacher(model, encoded, job.device, "hidden" in wanted, "attentions" in wanted)
        out[name] = {n: OnlineFeature(teacher, feature, layers[n]) for n, feature in wanted.items()}
        out[name]["labels"] = read_json(dirs[name] / "labels.json")
    return out
