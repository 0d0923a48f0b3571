"""The typed settings of Meta-KD's ``prototypes`` job (docs/design.md, "Style": settings read once), the config's
``prototypes`` section; torch-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kdpipe.core.settings import Settings


@dataclass(frozen=True)
class PrototypeSettings(Settings):
    """The backbone whose embeddings make the prototypes, how rows are grouped (``by``), and how it is run."""

    backbone: str
    by: str
    max_length: int
    batch_size: int
    local_content: Mapping[str, str] | None = None
