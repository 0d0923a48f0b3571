"""The gold labels a student depends on before its own training reads any: what its route read to fit the router,
what Meta-KD's per-example weights read, and what the model it starts from read
(docs/report.md, "Which gold labels each model read"). As ``{key: rows}``: a split, a split under :data:`ROUTER`,
or ``checkpoint`` with :data:`OUTSIDE`'s words.
"""

from __future__ import annotations

from pathlib import Path

from kdpipe.core.store import read_json
from kdpipe.evaluation.results import combined_label_use

ROUTER = "router: "  # the prefix of a split whose labels a route read to weigh the teachers
OUTSIDE = {"checkpoint": "trained outside kdpipe"}  # a model fine-tuned elsewhere: kdpipe cannot say what it read


def route_label_use(route_labels: dict) -> dict:
    """A route's ``gold_labels`` ({split: rows}) as a routed student records them: each split under
    :data:`ROUTER`, so that labels that fitted a router are told from labels that chose the kept epoch."""
    return {key if key.startswith(ROUTER) else f"{ROUTER}{key}": rows for key, rows in route_labels.items()}


def start_label_use(source: str | None) -> dict | None:
    """What the model a student starts from (``model.init.from``, ProKT's ``method_args.backbone``) read: a kdpipe
    model folder's own record, :data:`OUTSIDE` for a sequence classifier fine-tuned elsewhere, nothing for a
    pre-trained encoder or a builtin."""
    if not source:
        return {}
    manifest = Path(source) / "manifest.json"
    if manifest.is_file():
        return read_json(manifest).get("gold_labels")
    from kdpipe.models.heads import fine_tuned_classes

    return dict(OUTSIDE) if fine_tuned_classes(source) is not None else {}


def started_label_use(
    init_from: str | None, method, train_rows: int, route: dict | None, prototypes: Path | None
) -> dict | None:
    """The gold labels a distilled student reads besides its loss's and its validation's: its ``route``'s (its
    manifest), Meta-KD's example weights' and its starting model's (``init_from``). None when a part was not
    recorded."""
    uses = [route_label_use(route["gold_labels"]) if route is not None else {}]
    if "domain" in method.signals or method.prototypes:
        uses.append({"train": train_rows})
    if method.prototypes and prototypes is not None:  # built from every train row, whatever the student's domain
        from kdpipe.signals.io import manifest_path

        uses.append({"train": int(read_json(manifest_path(Path(prototypes)))["rows"])})
    uses.append(start_label_use(init_from))
    return combined_label_use([{"gold_labels": use} for use in uses])
