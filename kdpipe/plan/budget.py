"""The disk budget of the feature dumps, checked when the DAG is built (docs/design.md, "Feature dumps and their size").

Every dump the plan asks for is bounded from what is known before any job runs, and a plan whose dumps would not fit
stops with one message naming the largest dump and what would make it fit.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from kdpipe.core.store import KdpipeError, disk_reserve
from kdpipe.data.transfer_sources import transfer_rows_bound, transfer_sources
from kdpipe.methods.registry import get_method
from kdpipe.plan.paths import DATA, SIGNALS, SIGNALS_ROOT, TEACHER, TRANSFER
from kdpipe.signals.catalog import FEATURES
from kdpipe.signals.catalog import SIGNALS as CATALOG

GB = 1_000_000_000
TRANSFER_SPLIT = "transfer"  # (kdpipe.data.dataset.TRANSFER, which imports numpy: the plan must not)
MIN_MAX_LENGTH = 8  # the schema's least max_length


@dataclass(frozen=True)
class DumpBound:
    """The most bytes one feature dump can take: rows × max_length tokens, float16."""

    signal: str
    teacher: str
    split: str
    rows: int
    max_length: int
    layers: int
    width: int  # floats per token and layer: the hidden size, or the heads of per-head attentions (1 for their mean)

    @property
    def per_row_and_layer(self) -> int:
        tokens = self.max_length if self.signal == "hidden" else self.max_length**2
        return 2 * tokens * self.width

    @property
    def bytes(self) -> int:
        return self.rows * self.layers * self.per_row_and_layer

    def formula(self) -> str:
        tokens = f"{self.max_length} tokens" if self.signal == "hidden" else f"{self.max_length}² tokens²"
        width = {"hidden": "hidden units", "attentions": "heads"}.get(self.signal)
        return (
            f"{self.rows:,} rows x {tokens} (max_length) x {self.layers} layer{'s' * (self.layers != 1)}"
            + (f" x {self.width} {width}" if width else "")
            + " x 2 bytes"
        )

    def fitting(self, room: float) -> list[str]:
        """What would make this dump fit in ``room`` bytes: fewer layers, a shorter max_length."""
        out = []
        layers = int(room // (self.rows * self.per_row_and_layer)) if self.rows else self.layers
        if 1 <= layers < self.layers:
            out.append(
                f"{layers} layer{'s' * (layers != 1)} instead of {self.layers} (students with fewer layers align with "
                "fewer; DFA: method_args.align_number)"
            )
        share = room / self.bytes if self.bytes else 1.0
        length = int(self.max_length * (share if self.signal == "hidden" else math.sqrt(max(share, 0.0))))
        if MIN_MAX_LENGTH <= length < self.max_length:
            out.append(
                f"max_length {length} instead of {self.max_length} (teachers.{self.teacher.split('.')[0]}.max_length, "
                "and the same for the students that read it)"
            )
        rows = int(room // (self.layers * self.per_row_and_layer)) if self.layers else self.rows
        if self.split == TRANSFER_SPLIT and 1 <= rows < self.rows:  # (a student's share does not shrink it)
            out.append(f"dataset.transfer_max_rows: {rows:,} (of {self.rows:,} transfer rows)")
        if self.signal == "attentions" and self.width > 1 and self.bytes / self.width <= room:
            out.append("attentions averaged over heads (method_args.stage1.attention_heads: mean)")
        return out


def _size(n: float) -> str:
    return f"{n / GB:.3g} GB" if n >= GB / 100 else f"{n / 1e6:.3g} MB"


def split_rows(plan, split: str) -> int | None:
    """The rows of ``split`` of the plan's data (None: unknown before a job runs), from the artifact's manifest when it
    was made from this config, else as the prepare stage will make them; transfer rows at most the withheld training
    rows plus what the transfer files hold, capped by ``dataset.transfer_max_rows``."""
    rows = plan.data_rows
    if plan.split_data(split) != TRANSFER.format(dataset=plan.dataset):
        return rows.get(split)
    made = _made_rows(Path(TRANSFER.format(dataset=plan.dataset)), plan.transfer_params())
    if made is not None:
        return made.get(split)
    dataset = plan.config["dataset"]
    sources = transfer_sources(dataset.get("transfer"))
    files = transfer_rows_bound(sources, dataset["format"], dataset.get("transfer_max_rows")) if sources else 0
    if files is None:
        return None  # a Hugging Face dataset: counted only by the transfer job
    cap = dataset.get("transfer_max_rows")
    withheld = rows.get("unlabelled", 0)
    return withheld + files if cap is None else min(withheld + files, cap)


def made_from(manifest: Path, params: dict) -> dict | None:
    """The manifest at ``manifest`` when its artifact was made from ``params`` (None: missing, or made otherwise)."""
    try:
        made = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    return made if json.dumps(made.get("config"), sort_keys=True) == json.dumps(params, sort_keys=True) else None


def _made_rows(folder: Path, params: dict) -> dict | None:
    """The ``rows`` (and withheld ``unlabelled_rows``) of an artifact's manifest when it was made from ``params``."""
    manifest = made_from(folder / "manifest.json", params)
    return None if manifest is None else {**manifest.get("rows", {}), "unlabelled": manifest.get("unlabelled_rows", 0)}


class Budget:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    @cached_property
    def selected_data(self) -> tuple[dict, list[str]]:
        """(rows per split, labels) of the dataset as the prepare stage will make it, from one read of its source
        (pandas, only when the data is not prepared yet)."""
        from kdpipe.data.prepare import _selected
        from kdpipe.data.settings import DatasetSettings

        parts, labels, _ = _selected(DatasetSettings.from_params(self.prepare_params(), "dataset"))
        return {split: len(frame) for split, frame in parts.items()}, labels

    @cached_property
    def data_rows(self) -> dict:
        """The rows of each split of the prepared dataset (:func:`split_rows`)."""
        rows = _made_rows(Path(DATA.format(dataset=self.dataset)), self.prepare_params())
        return rows if rows is not None else self.selected_data[0]

    def online(self, student: str) -> bool:
        """The student computes its token-level teacher signals itself (``signals: online``, kdpipe.signals.online)
        instead of reading dumps: its teachers' folders are then inputs of its job."""
        config = self.students[student].config
        reads = {"hidden", "attentions"} & set(get_method(config.get("method", "")).signals)
        return config.get("signals", "cached") == "online" and bool(reads)

    def online_teacher_dirs(self, student: str) -> list[str]:
        """The teachers a ``signals: online`` student runs in its own job (none for any other student)."""
        return [TEACHER.format(teacher=t) for t in self.student_teachers(student)] if self.online(student) else []

    def planned_dumps(self) -> dict[tuple[str, str, str], list[str]]:
        """Every feature dump some student reads, as (signal, teacher, split) -> the students that read it."""
        by_file = {file: name for name, spec in CATALOG.items() for file in spec.files}
        out: dict[tuple[str, str, str], list[str]] = {}
        for student in self.students:
            for path in self.signal_files(student):
                teacher, split, file = path[len(SIGNALS_ROOT) + 1 :].split("/")
                signal = by_file.get(file)
                if signal in FEATURES and file == CATALOG[signal].files[0]:
                    out.setdefault((signal, teacher, split), []).append(student)
        return out

    def dump_bound(self, signal: str, teacher: str, split: str) -> DumpBound | None:
        """The most bytes a feature dump can take (None when its split's rows are not known before it runs)."""
        rows = split_rows(self, split)
        if rows is None:
            return None
        width = {"hidden": self.teacher_hidden_size(teacher), "attentions": self.teacher_heads(teacher)}.get(signal, 1)
        layers = len(self.feature_layers(teacher, signal))
        return DumpBound(signal, teacher, split, rows, int(self.teachers[teacher]["max_length"]), layers, width)

    def _made(self, signal: str, teacher: str, split: str) -> bool:
        """The dump is already there, made with the same settings (it needs no new room)."""
        folder = Path(SIGNALS.format(teacher=teacher, split=split))
        manifest = made_from(folder / CATALOG[signal].manifest, self.signal_params(teacher, split, signal))
        if manifest is None or manifest.get("layout") != "packed":
            return False
        # the same settings on other data (a grown split, another transfer file) need room of their own
        rows = split_rows(self, split)
        return rows is not None and manifest.get("rows") == rows

    def check_dump_budget(self) -> None:
        """Stop, before any job runs, a plan whose feature dumps would not fit their budget (module docstring)."""
        planned = self.planned_dumps()
        keys = [key for key in planned if not self._made(*key)]
        bounds = [self.dump_bound(*key) for key in keys]
        unknown = sorted({key[2] for key, bound in zip(keys, bounds) if bound is None})
        if unknown:  # e.g. transfer rows from the Hugging Face hub: counted only by the transfer job
            print(
                f"[kdpipe] dump.max_gb: the rows of split(s) {', '.join(unknown)} cannot be counted before their job "
                "runs; the feature dumps on them are not checked against the disk budget",
                file=sys.stderr,
            )
        bounds = [b for b in bounds if b is not None and b.bytes]
        if not bounds:
            return
        need = sum(b.bytes for b in bounds)
        largest = max(bounds, key=lambda b: b.bytes)
        limit = self.config.get("dump", {}).get("max_gb")
        if limit is not None:
            budget, factor = float(limit) * GB, 1
            if need <= budget:
                return
            what = f"dump.max_gb allows {_size(budget)}"
        else:
            folder = Path(SIGNALS_ROOT).absolute()
            while not folder.exists():
                folder = folder.parent
            free = shutil.disk_usage(folder).free
            reserve = disk_reserve(need)
            # a dump's shard parts stay until its gather has copied them: the largest is on disk twice for a while
            budget, factor = free - reserve, 2
            if need + largest.bytes <= budget:
                return
            what = (
                f"{_size(free)} are free at {folder} (with {_size(reserve)} kept in reserve, and room for the largest "
                "dump's shard parts beside it; dump.max_gb sets another budget)"
            )
        room = (budget - (need - largest.bytes)) / factor
        # the students as the config names them (a seed's job or Meta-KD's first stage is its entry's)
        jobs = planned[(largest.signal, largest.teacher, largest.split)]
        readers = ", ".join(sorted({self.students[s].entry for s in jobs}))
        online = f"signals: online on {readers} (the students run the teacher in their own jobs; no dump)"
        if room > 0:
            fixes = [*largest.fitting(room), online]
            advice = "it would fit with " + "; or ".join(fixes[:-1]) + "; or it needs no room with " + online
            if len(fixes) == 1:
                advice = f"not even one layer at max_length {MIN_MAX_LENGTH} fits; it needs no room with {online}"
        else:
            advice = f"the other dumps alone take {_size(need - largest.bytes)}; raise the budget, or set {online}"
        raise KdpipeError(
            f"dump.max_gb: the feature dumps of this config take up to {_size(need)} ({len(bounds)} "
            f"dump{'s' * (len(bounds) != 1)}), but {what}. The largest, {largest.signal} of teacher "
            f"'{largest.teacher}' on split '{largest.split}' (read by {readers}), takes up to {_size(largest.bytes)} "
            f"({largest.formula()}): {advice}"
        )
