"""Open a fine-tuned teacher and one data split for a signal pass (MC-dropout, dumps)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kdpipe.core.memory import release_freed_memory
from kdpipe.core.store import read_json, read_manifest
from kdpipe.data.batching import Encoded, encode_frame
from kdpipe.data.dataset import read_labels, read_split
from kdpipe.models.loading import load_tokenizer, load_trained


@dataclass
class TeacherPass:
    model: object
    encoded: Encoded
    labels: list[str]  # the teacher's classes, in its output order
    teacher_config: dict  # the config slice the teacher was trained with (from its manifest)
    teacher_dir: Path
    data_dir: Path


def open_teacher(teacher_dir: Path, data_dir: Path, split: str, *, attn: str | None = None) -> TeacherPass:
    """Load the teacher and tokenise all of ``split`` its way (a subset teacher too: MUKI reads every row)."""
    teacher_dir, data_dir = Path(teacher_dir), Path(data_dir)
    manifest = read_manifest(teacher_dir / "manifest.json", kind="teacher", dataset_labels=read_labels(data_dir))
    model = load_trained(teacher_dir, attn=attn)
    tokenizer = load_tokenizer(str(teacher_dir))
    frame = read_split(data_dir, split)
    encoded = encode_frame(tokenizer, frame, max_length=manifest["config"]["max_length"])
    del frame
    release_freed_memory()  # what reading and tokenising the split allocated for a while (memory flat in N)
    labels = read_json(teacher_dir / "labels.json")
    return TeacherPass(model, encoded, labels, manifest["config"], teacher_dir, data_dir)
