"""The teacher signal passes a config runs (docs/design.md, "Signals"; docs/caching-and-reruns.md).

A pass (one job, or S shard jobs and a gather) makes the signals of one teacher on one split that some job reads:
the shared forward pass every deterministic one (:mod:`kdpipe.signals.forward`), MC-dropout a pass of its own.
"""

from __future__ import annotations

from functools import cached_property

from kdpipe.plan.paths import SIGNALS, SIGNALS_ROOT
from kdpipe.signals.catalog import SIGNALS as CATALOG
from kdpipe.signals.catalog import pass_of, signal_spec

FORWARD = "forward"  # the name of the shared forward pass (kdpipe.signals.catalog.pass_of)


class Passes:
    """Mixed into :class:`kdpipe.plan.Plan`."""

    @cached_property
    def requested_signals(self) -> dict[tuple[str, str], list[str]]:
        """(teacher, split) -> the signals some job reads there (catalog order), from the signal files the rules
        declare: every student's, every route's (train and transfer rows), and the MC-dropout targets."""
        paths = [path for student in self.students for path in self.signal_files(student)]
        paths += [path for route in self.routes() for path in self.route_inputs(route)]
        paths += [path for route in self.transfer_routes() for path in self.route_transfer_inputs(route)]
        paths += [SIGNALS.format(teacher=t, split=s) + "/mc.json" for t in self.teachers for s in self.mc_splits()]
        wanted: dict[tuple[str, str], set[str]] = {}
        for path in paths:
            teacher, split, file = path[len(SIGNALS_ROOT) + 1 :].split("/")
            wanted.setdefault((teacher, split), set()).add(file.split(".")[0])
        return {key: [name for name in CATALOG if name in names] for key, names in sorted(wanted.items())}

    def passes(self) -> dict[tuple[str, ...], list[tuple[str, str]]]:
        """Every pass, as the signals it makes -> the (teacher, split) pairs it runs on, of every teacher but a
        prompted one (the rules of S = 1 are made from it, one per distinct set of signals)."""
        out: dict[tuple[str, ...], list[tuple[str, str]]] = {}
        for pair, names in self.requested_signals.items():
            if self.prompted(pair[0]):  # its own passes make its signals (kdpipe.plan.prompted)
                continue
            for which in dict.fromkeys(map(pass_of, names)):
                out.setdefault(tuple(n for n in names if pass_of(n) == which), []).append(pair)
        return out

    def pass_signals(self, teacher: str, split: str, which: str) -> list[str]:
        """The signals pass ``which`` (``forward`` or ``mc``) makes of a teacher on a split."""
        return [n for n in self.requested_signals.get((teacher, split), []) if pass_of(n) == which]

    def pass_params(self, teacher: str, split: str, signals: list[str]) -> dict:
        """The slice of a pass: the slice of each signal it makes (:meth:`signal_params`), in catalog order."""
        return {"signals": [self.signal_params(teacher, split, name) for name in signals]}

    def pass_modules(self, signals: list[str]) -> list[str]:
        """The modules a pass imports by name: each signal's, and the shared forward for deterministic ones."""
        modules = [signal_spec(name).module for name in signals]
        return modules + (["kdpipe.signals.forward"] if any(pass_of(n) == FORWARD for n in signals) else [])
