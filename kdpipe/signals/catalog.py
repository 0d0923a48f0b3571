"""Every cached teacher signal, named once: its files, the pass that computes it and how it is sharded.

Torch-free: the plan and the workflow read it when the DAG is built (docs/design.md, "The signal catalog"). A
module is imported by name, so only the jobs that make its signal carry it in their code fingerprint. To add a
signal, add one line here and write its module (docs/adding-a-method.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.core.store import KdpipeError


@dataclass(frozen=True)
class Signal:
    name: str  # the signal's name everywhere: rule wildcard, CLI --signal, file stem
    files: tuple[str, ...]  # its files in the signal folder, the manifest last
    module: str  # the pass that computes it
    shards: str  # the config section whose `shards` sets how many shard jobs it runs as
    summary: str
    forward: bool = True  # made by the teacher's shared eval-mode forward pass (kdpipe.signals.forward)
    attention: str | None = None  # the attention implementation its forward needs (None: the model's default)

    @property
    def manifest(self) -> str:
        return self.files[-1]


def _dump(name: str, summary: str, attention: str | None = None) -> Signal:
    """A token-level dump: the packed data, its offsets and tokens sidecars (kdpipe.signals.packed), its manifest."""
    files = (f"{name}.npy", f"{name}.offsets.npy", f"{name}.tokens.npy", f"{name}.json")
    return Signal(name, files, "kdpipe.signals.features", "dump", summary, attention=attention)


SIGNALS = {
    signal.name: signal
    for signal in (
        Signal(
            "logits",
            ("logits.parquet", "logits.json"),
            "kdpipe.signals.logits",
            "dump",
            "eval-mode logits [N, C_teacher]",
        ),
        Signal(
            "mc",
            ("mc.npy", "mc.parquet", "mc.json"),
            "kdpipe.signals.mc_dropout",
            "mc_dropout",
            "MC-dropout mean probabilities [N, C_teacher] and per-row uncertainty scores",
            forward=False,
        ),
        Signal(
            "pooled",
            ("pooled.npy", "pooled.json"),
            "kdpipe.signals.pooled",
            "dump",
            "mean last-layer hidden state of each row, float32 [N, H] (the routers' features)",
        ),
        _dump(
            "hidden",
            "hidden states of the aligned layers, float16 [T, L_sel, H] over the rows' T real tokens (no padding)",
        ),
        _dump(
            "attentions",
            "attention probabilities of the aligned layers, float16, each row's [L_sel, heads, len, len] packed flat",
            attention="eager",  # the default SDPA returns no attention probabilities
        ),
        _dump(
            "attentions_mean",
            "attention probabilities averaged over heads, float16, each row's [L_sel, len, len] packed flat",
            attention="eager",
        ),
        Signal(
            "domain",
            ("domain.npy", "domain.parquet", "domain.json"),
            "kdpipe.methods.meta_kd.domain",
            "dump",
            "a meta-teacher's domain representations [N, H] and domain-expertise weights (Meta-KD)",
        ),
    )
}

# The signals a feature dump writes: the layers they keep depend on the students that read them.
FEATURES = ("hidden", "attentions", "attentions_mean")


def signal_spec(name: str) -> Signal:
    try:
        return SIGNALS[name]
    except KeyError:
        raise KdpipeError(f"unknown signal {name!r}; signals are {', '.join(SIGNALS)}") from None


def pass_of(name: str) -> str:
    """The pass that makes signal ``name``: ``forward`` (the shared one) or the signal itself (MC-dropout)."""
    return "forward" if signal_spec(name).forward else name


def signal_files(name: str, folder: str) -> list[str]:
    """The paths of signal ``name`` in ``folder`` (a teacher's signal folder for one split)."""
    return [f"{folder}/{file}" for file in signal_spec(name).files]
