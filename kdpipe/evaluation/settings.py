"""The typed settings of an evaluation job, ``evaluate`` or ``evaluate-ensemble`` (docs/design.md, "Style": settings
read once), made by :meth:`kdpipe.plan.slices.Slices.eval_params`; torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from kdpipe.core.settings import Settings

INFO = ("model", "base", "group", "kind", "method", "seed", "split", "domain")  # each evaluation record's first keys


@dataclass(frozen=True)
class OodSpec(Settings):
    """``evaluate.ood`` as an evaluation's slice holds it (the keys that are set): held-out classes, or an external
    file and its text column."""

    classes: tuple[str, ...] | None = None
    source: str | None = None
    text_column: str | None = None


@dataclass(frozen=True)
class EvalSettings(Settings):
    """One model's evaluation on every split of ``splits``: what its records say of it (model, base, group, kind,
    method, seed, domain), how it is evaluated (batch size, ECE bins, MC-dropout samples and seed), the OOD set
    (``ood``), for a model made from others' predictions its ``members`` and how they combine, and for a student's
    exported graph its precision (``exported``: onnx or int8)."""

    model: str
    base: str
    kind: str
    method: str | None
    seed: int | None
    splits: tuple[str, ...]
    batch_size: int
    ece_bins: int
    group: str | None = None
    domain: str | None = None
    ood: OodSpec | None = None
    mc_samples: int | None = None
    mc_seed: int | None = None
    members: tuple[str, ...] | None = None
    combine: str | None = None
    exported: str | None = None

    def info(self, split: str) -> dict:
        """What the evaluation record of ``split`` says of the model (:data:`INFO`)."""
        return {key: split if key == "split" else getattr(self, key) for key in INFO}
