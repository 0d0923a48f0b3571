"""Typed settings of the models (docs/design.md, "Style": settings read once): a student's ``model`` entry
(docs/configuration.md, ``students.<name>.model``; a key left out is None, and the builder uses its own size), and
the slices of the ``export``, ``quantize`` and ``serve`` jobs. Torch-free: the plan reads them."""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.core.settings import Settings, from_schema, renamed


@dataclass(frozen=True)
class ModelInit(Settings):
    """``init``: start from the backbone or model folder ``from``, keeping its ``layers`` (all when left out)."""

    from_: str = renamed("from")
    layers: tuple[int, ...] | None = None


@dataclass(frozen=True)
class BertSpec(Settings):
    """``config``: a BERT built from scratch over a tokenizer's vocabulary."""

    tokenizer: str | None = None
    hidden_size: int | None = None
    num_layers: int | None = None
    num_heads: int | None = None
    intermediate_size: int | None = None


@dataclass(frozen=True)
class HeadsSpec(Settings):
    """``heads``: a multi-head (Hydra) student's heads, each of the top ``layers`` layers (1 when left out)."""

    count: int
    layers: int | None = None


@dataclass(frozen=True)
class StudentModel(Settings):
    """A student's ``model``: one of ``init``, ``config`` or ``type: bilstm`` (with its tokenizer and sizes), and
    ``heads`` started as ``head_init`` and ``head_noise`` say."""

    init: ModelInit | None = None
    config: BertSpec | None = None
    type: str | None = None
    tokenizer: str | None = None
    embedding_dim: int | None = None
    hidden_size: int | None = None
    fc_size: int | None = None
    dropout: float | None = None
    heads: HeadsSpec | None = None
    head_init: str = from_schema("student_defaults", "model", "head_init")
    head_noise: float = from_schema("student_defaults", "model", "head_noise")

    @property
    def init_from(self) -> str | None:
        """The model folder or backbone it starts from (``init.from``), if any."""
        return self.init.from_ if self.init else None


@dataclass(frozen=True)
class ExportSettings(Settings):
    """An ``export`` job's slice."""

    model: str
    student: str
    opset: int


@dataclass(frozen=True)
class QuantizeSettings(Settings):
    """A ``quantize`` job's slice (``max_accuracy_drop``: ``export.max_accuracy_drop``)."""

    model: str
    student: str
    max_accuracy_drop: float


@dataclass(frozen=True)
class ServingSettings(Settings):
    """A ``serve`` job's slice: the profiled model's name and kind, and the ``serving`` settings."""

    model: str
    kind: str
    rows: int
    batch_size: int
    threads: int
