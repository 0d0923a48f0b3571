"""What a route reads (docs/routing.md): the data's train and validation splits and, for every teacher, the cached
signals the plan declared as the route job's inputs, and nothing else.

The plan passes the declared signals per split in the job's config slice (``signals``). A signal file that is not
declared is never opened, even where it exists: Snakemake does not track it, so it may be stale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kdpipe.core.store import KdpipeError
from kdpipe.data.dataset import TRANSFER, read_labels, read_split
from kdpipe.data.labelspace import teacher_blocks
from kdpipe.routing import ROUTE_SPLITS
from kdpipe.signals.catalog import SIGNALS
from kdpipe.signals.io import read_logits, read_mc, read_pooled


class RouteInputs:
    """The data and every teacher's signals on ``splits`` that the route declared (``signals``: split -> names, the
    same for every teacher), under ``root/<teacher>/<split>/``; the transfer split's rows come from the transfer
    artifact ``transfer``."""

    def __init__(
        self,
        teachers: list[str],
        data: Path,
        root: Path,
        signals: dict[str, list[str]],
        splits: tuple[str, ...] = ROUTE_SPLITS,
        transfer: Path | None = None,
    ):
        self.root = Path(root)
        self.signals = {split: tuple(names) for split, names in signals.items()}
        self.teachers = list(teachers)
        self.labels = read_labels(data)
        self.frames = {s: read_split(transfer if s == TRANSFER else data, s) for s in splits}
        self.row_ids = {s: f["row_id"].to_numpy() for s, f in self.frames.items()}
        self.gold = {s: f["label_id"].to_numpy() for s, f in self.frames.items() if s != TRANSFER}
        self.logits, self.pooled, self.mc = {}, {}, {}
        classes = {}
        for t in self.teachers:
            for s in splits:
                self.logits[t, s], classes[t] = read_logits(self.signal_path(t, s, "logits"), self.row_ids[s])
                self.pooled[t, s], _ = read_pooled(self.signal_path(t, s, "pooled"), self.row_ids[s])
                if self.has_mc(s):
                    probs, table = read_mc(self.signal_path(t, s, "mc"), self.row_ids[s], classes[t])
                    self.mc[t, s] = (np.asarray(probs), table)
        self.blocks = teacher_blocks(classes, self.labels, policy="disjoint", where="route")
        owner = np.empty(len(self.labels), np.int64)
        for k, t in enumerate(self.teachers):
            owner[self.blocks[t]] = k
        self.owners = {s: owner[g] for s, g in self.gold.items()}
        # each teacher's predicted class as a student label index, [N, K]
        self.predictions = {
            s: np.stack([self.blocks[t][self.logits[t, s].argmax(-1)] for t in self.teachers], -1) for s in self.gold
        }

    def own_rows(self, teacher: str, split: str) -> np.ndarray:
        return np.isin(self.gold[split], self.blocks[teacher])

    def signal_path(self, teacher: str, split: str, name: str) -> Path:
        """The file of signal ``name`` of ``teacher`` on ``split``; an error for a signal the job did not declare."""
        if name not in self.signals.get(split, ()):
            declared = ", ".join(self.signals.get(split, ())) or "none"
            raise KdpipeError(
                f"route: the {name} signal of {teacher} on {split} is not among the route's declared inputs "
                f"(on {split}: {declared}); a route reads only what its rule declares"
            )
        return self.root / teacher / split / SIGNALS[name].files[0]

    def has_mc(self, split: str) -> bool:
        """Whether the route declared (and so read) the MC-dropout signal of its teachers on ``split``."""
        return "mc" in self.signals.get(split, ())
