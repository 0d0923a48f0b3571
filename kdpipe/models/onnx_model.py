"""An exported (ONNX) model folder as a model of kdpipe's inference path: a module that gives the logits of a
collated batch the way :func:`kdpipe.models.inference.predict_logits` reads them, so that the ``evaluate`` stage and
``kdpipe predict`` run an exported folder as any model
(docs/your-own-models-and-data.md, "Using the student you get").

:func:`kdpipe.models.loading.load_trained` opens a folder with ``onnx.json`` through :func:`load_onnx` (imported by
name, as the multi-head and BiLSTM loaders are). The graph runs in ONNX Runtime on the CPU
(:class:`kdpipe.models.onnx_runtime.OnnxRunner`) with as many threads as torch was given; the batch's tensors are
handed over as numpy arrays and the outputs come back as CPU tensors, whatever device the job picked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

from kdpipe.models.onnx_runtime import OnnxRunner


@dataclass
class ExportedOutput:
    """``logits`` [B, C] and, for a multi-head student, ``head_logits`` [M, B, C] (else None)."""

    logits: torch.Tensor
    head_logits: torch.Tensor | None = None


class OnnxClassifier(nn.Module):
    """An exported graph behind a module's call: ``model(**batch)`` -> :class:`ExportedOutput`. It has no torch
    parameters; ``parameter_count`` is the fp32 model's (:func:`kdpipe.models.loading.count_parameters` reads it)."""

    def __init__(self, runner: OnnxRunner):
        super().__init__()
        self.runner = runner
        spec = runner.spec
        labels = runner.labels
        self.config = SimpleNamespace(
            num_labels=len(labels), id2label=dict(enumerate(labels)), label2id={c: i for i, c in enumerate(labels)}
        )
        self.parameter_count = int(spec.get("parameters") or 0)
        self.separate_pairs = bool(spec.get("separate_pairs"))
        threads = runner.session.get_session_options().intra_op_num_threads
        precision = spec.get("precision", "fp32")
        self.runs_on = f"CPU, ONNX Runtime {precision}, {threads} thread{'s' if threads != 1 else ''}"

    def forward(self, input_ids: torch.Tensor, **inputs) -> ExportedOutput:
        feed = {"input_ids": input_ids, **{k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}}
        out = self.runner.run({k: v.detach().cpu().numpy() for k, v in feed.items()})
        heads = out.get("head_logits")
        return ExportedOutput(
            logits=torch.from_numpy(out["logits"]), head_logits=None if heads is None else torch.from_numpy(heads)
        )


def load_onnx(model_dir: str | Path, *, attn: str | None = None) -> OnnxClassifier:
    """The exported folder ``model_dir`` as a module (``attn`` is ignored: the graph is fixed), its ONNX Runtime
    session using torch's CPU threads."""
    return OnnxClassifier(OnnxRunner(model_dir, threads=torch.get_num_threads()))
