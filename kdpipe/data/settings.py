"""The typed settings of the data stages (docs/design.md, "Style": settings read once): the ``prepare`` job's
dataset section, the ``transfer`` job's and the ``ood`` job's slices (made by ``kdpipe.plan``), and MUKI's slice of
the classes a teacher covers. Torch-free and pandas-free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kdpipe.core.settings import Settings, from_schema, schema_completed
from kdpipe.data.transfer_sources import TRANSFER_KEYS


@dataclass(frozen=True)
class DatasetFiles(Settings):
    """``dataset.files``: explicit per-split files."""

    train: str
    validation: str | None = None
    test: str | None = None


@dataclass(frozen=True)
class HfSplits(Settings):
    """``dataset.hf_splits``: which split of a Hugging Face dataset plays each role."""

    train: str | None = None
    validation: str | None = None
    test: str | None = None


@dataclass(frozen=True)
class DatasetSplit(Settings):
    """``dataset.split``: the split fractions and seed, the column of whole groups, the withheld share."""

    validation: float
    test: float
    seed: int
    group_column: str | None = from_schema("dataset", "split", "group_column")
    unlabelled: float = from_schema("dataset", "split", "unlabelled")


@dataclass(frozen=True)
class DatasetSettings(Settings):
    """The ``prepare`` job's slice: the ``dataset`` section without its transfer keys, the classes held out as the
    OOD set (``ood_classes``) and the digests of local files (``local_content``)."""

    name: str
    source: str | None
    files: DatasetFiles | None
    hf_splits: HfSplits | None
    format: str
    encoding: str
    text_column: str
    text_pair_column: str | None
    label_column: str
    domain_column: str | None
    split: DatasetSplit
    max_rows: int | None
    max_per_class: int | None
    dedup: bool
    conflicts: str = from_schema("dataset", "conflicts")
    id_column: str | None = from_schema("dataset", "id_column")
    normalize_labels: bool = from_schema("dataset", "normalize_labels")
    ood_classes: tuple[str, ...] = ()
    local_content: Mapping[str, str] | None = None

    @classmethod
    def of_section(cls, section: object, where: str = "dataset") -> DatasetSettings:
        """The prepare job's settings of a config's ``dataset`` section, completed with the schema's defaults."""
        completed = schema_completed(section, "dataset")
        return cls.from_params({k: v for k, v in completed.items() if k not in TRANSFER_KEYS}, where)


@dataclass(frozen=True)
class SplitSeed(Settings):
    """The part of ``dataset.split`` a job besides prepare reads: its seed."""

    seed: int


@dataclass(frozen=True)
class TransferSettings(Settings):
    """The ``transfer`` job's slice: the transfer sources and how they are read, the seed, and the smallest
    ``max_length`` of any model (null: whole texts compared)."""

    name: str
    transfer: str | tuple[str, ...] | None
    transfer_max_rows: int | None
    text_column: str
    text_pair_column: str | None
    format: str
    encoding: str
    split: SplitSeed
    max_length: int | None
    local_content: Mapping[str, str] | None = None


@dataclass(frozen=True)
class OodSourceSettings(Settings):
    """The ``ood`` job's slice: the external OOD file and how it is read (kdpipe.data.ood)."""

    name: str
    source: str
    text_column: str
    text_pair_column: str | None
    format: str
    encoding: str
    local_content: Mapping[str, str] | None = None


@dataclass(frozen=True)
class ClassSlice(Settings):
    """MUKI's contiguous slice of the dataset's label order, ``{slice: k, of: K}`` (a teacher's ``classes``)."""

    slice: int
    of: int
