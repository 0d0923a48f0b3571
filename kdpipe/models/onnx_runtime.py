"""An exported model folder run by ONNX Runtime without torch or transformers: its graph, its tokenizer (the
`tokenizers` library reading the folder's ``tokenizer.json``) and its classes
(docs/your-own-models-and-data.md, "Using the student you get").

A folder written by :mod:`kdpipe.models.export` holds ``model.onnx``, ``onnx.json`` (what the graph takes and
gives, its precision, the ``max_length`` it was trained at), the tokenizer's files, ``labels.json`` and a manifest.
:class:`OnnxRunner` opens it; :meth:`OnnxRunner.predict_proba` is a request as a server makes it (texts in, class
probabilities out), and :meth:`OnnxRunner.run` runs the graph on inputs already tokenised (kdpipe's own batches,
:mod:`kdpipe.models.onnx_model`). Importing this module imports neither torch nor transformers, so a process that
serves an exported model holds only ONNX Runtime, the tokenizer and numpy (docs/report.md, "Serving profiles").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from kdpipe.core.store import KdpipeError

MODEL_FILE = "model.onnx"
SPEC_FILE = "onnx.json"  # the marker of an exported folder (kdpipe.models.loading.ARCHITECTURE_FILES)
TOKENIZER_FILE = "tokenizer.json"


def is_onnx_folder(folder: str | Path) -> bool:
    """Whether ``folder`` is an exported model folder (it has ``onnx.json``)."""
    return (Path(folder) / SPEC_FILE).is_file()


def read_spec(folder: str | Path) -> dict:
    """The folder's ``onnx.json``, or one line saying the folder is no exported model."""
    path = Path(folder) / SPEC_FILE
    if not path.is_file():
        raise KdpipeError(f"{folder}: not an exported ONNX model folder (no {SPEC_FILE}); export a student first")
    return json.loads(path.read_text())


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, in float64 then float32."""
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


class OnnxRunner:
    """An exported folder opened for inference on the CPU: an ONNX Runtime session (all graph optimisations,
    ``threads`` intra-op threads, one inter-op thread) and its tokenizer."""

    def __init__(self, folder: str | Path, *, threads: int | None = None):
        import onnxruntime as ort

        self.folder = Path(folder)
        self.spec = read_spec(self.folder)
        self.labels = json.loads((self.folder / "labels.json").read_text())
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.inter_op_num_threads = 1
        if threads:
            options.intra_op_num_threads = int(threads)
        self.threads = threads
        try:
            self.session = ort.InferenceSession(
                str(self.folder / MODEL_FILE), options, providers=["CPUExecutionProvider"]
            )
        except Exception as err:  # (ONNX Runtime raises its own classes, one per status code)
            first = (str(err).strip().splitlines() or [""])[0]
            raise KdpipeError(f"{self.folder / MODEL_FILE}: ONNX Runtime cannot open it ({first})") from err
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self._tokenizer = None

    @property
    def max_length(self) -> int:
        return int(self.spec["max_length"])

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The graph's outputs (``logits`` [B, C], and ``head_logits`` [M, B, C] for a multi-head student) for
        tokenised inputs: int64 arrays named as kdpipe's batches name them; inputs the graph does not take are
        left out, and token types it takes but ``feed`` lacks are zeros."""
        given = {}
        for name in self.inputs:
            if name in feed:
                given[name] = np.ascontiguousarray(feed[name], dtype=np.int64)
            elif name == "token_type_ids":
                given[name] = np.zeros_like(np.asarray(feed["input_ids"]), dtype=np.int64)
            else:
                raise KdpipeError(f"{self.folder}: the graph takes '{name}', which the inputs lack")
        return dict(zip(self.outputs, self.session.run(self.outputs, given)))

    def tokenizer(self):
        """The folder's tokenizer (`tokenizers`), cutting at ``max_length`` as kdpipe did, without padding."""
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            path = self.folder / TOKENIZER_FILE
            if not path.is_file():
                raise KdpipeError(f"{self.folder}: no {TOKENIZER_FILE} (a fast tokenizer's file) to tokenise with")
            tokenizer = Tokenizer.from_file(str(path))
            tokenizer.enable_truncation(max_length=self.max_length)
            tokenizer.no_padding()
            self._tokenizer = tokenizer
        return self._tokenizer

    def encode(self, texts: list[str], pairs: list[str] | None = None) -> dict[str, np.ndarray]:
        """Model inputs for ``texts`` (and their ``pairs``), each row padded to the batch's longest, as kdpipe pads:
        one pair sequence, or with ``separate_pairs`` (the BiLSTM) each side on its own."""
        tokenizer = self.tokenizer()
        if pairs is not None and not self.spec.get("separate_pairs"):
            encodings = tokenizer.encode_batch(list(zip(texts, pairs)))
        else:
            encodings = tokenizer.encode_batch(list(texts))
        feed = _padded(encodings, int(self.spec["pad_token_id"]))
        if pairs is not None and self.spec.get("separate_pairs"):
            side = _padded(tokenizer.encode_batch(list(pairs)), int(self.spec["pad_token_id"]))
            feed["pair_input_ids"], feed["pair_attention_mask"] = side["input_ids"], side["attention_mask"]
        return feed

    def predict_proba(self, texts: list[str], pairs: list[str] | None = None) -> np.ndarray:
        """Class probabilities [N, C] of ``texts`` in one batch, as kdpipe evaluates the model: the softmax of
        ``logits``, which for a multi-head student is the log of its heads' mean probability."""
        return softmax(self.run(self.encode(texts, pairs))["logits"])


def _padded(encodings, pad_id: int) -> dict[str, np.ndarray]:
    """``input_ids``, ``attention_mask`` and ``token_type_ids`` of ``encodings``, padded to the longest row."""
    width = max((len(e.ids) for e in encodings), default=0)
    ids = np.full((len(encodings), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(encodings), width), dtype=np.int64)
    types = np.zeros((len(encodings), width), dtype=np.int64)
    for i, encoding in enumerate(encodings):
        n = len(encoding.ids)
        ids[i, :n], mask[i, :n], types[i, :n] = encoding.ids, 1, encoding.type_ids
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
