"""The report's routing section (docs/routing.md, "Diagnostics"): from every route's manifest, a table of each
router's routing and target accuracy (``routing.tsv``, ``routing.md``, the routes' warnings first, and where
recorded the teachers' certainty scores as OOD detection) and a plot of the per-class validation routing accuracy
(``routing.png``).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kdpipe.core.store import atomic_path, read_manifest
from kdpipe.report.figures import pyplot, save
from kdpipe.report.markdown import markdown_table, plain
from kdpipe.routing.diagnostics import OOD_ORIENTATION, WARN_BELOW, route_warning

COLUMNS = (
    "route", "router", "chosen", "gold_labels",
    "routing_validation", "routing_train", "target_validation", "target_train",
)  # fmt: skip


def read_routes(manifests: list[str | Path], warn_below: float = WARN_BELOW) -> list[dict]:
    """Each route's manifest, with its folder name as ``route`` and its ``warning`` at the threshold
    ``warn_below`` (None: nothing to warn of)."""
    routes = []
    for path in manifests:
        route = {**read_manifest(path, kind="route"), "route": Path(path).parent.name}
        route["warning"] = route_warning(route, warn_below)
        routes.append(route)
    return routes


def routing_table(routes: list[dict]) -> pd.DataFrame:
    """One row per route and router: its routing and target accuracy on validation and train (NaN where the
    route could not score a split)."""
    rows = []
    for route in routes:
        for router, d in route["diagnostics"].items():
            row = {"route": route["route"], "router": router, "chosen": router == route["router"]}
            row["gold_labels"] = d["gold_labels"]
            for split in ("validation", "train"):
                for what in ("routing", "target"):
                    row[f"{what}_{split}"] = d[split][what]["accuracy"] if split in d else float("nan")
            rows.append(row)
    return pd.DataFrame(rows, columns=list(COLUMNS))


OOD_NOTE = (
    "AUROC of each teacher's certainty score at telling the rows of another teacher's classes from the rows of its "
    "own, the score oriented so that larger means less certain (+ as stored, − negated): 1.0 separates them "
    "perfectly, 0.5 means the score cannot tell own from other rows, so it gives a router nothing to pick this "
    "teacher by (below 0.5, the teacher is more certain outside its classes). MC-dropout scores as cached, "
    "logit_max_prob the max softmax of the eval-mode logits, none calibrated; —: not measured (no MC-dropout signal "
    "read on the split, a column the signal lacks, or no row on one side).\n"
)
OOD_SPLITS = ("validation", "train")  # in the order of the routing table's columns


def ood_markdown(route: dict) -> str | None:
    """The table "Certainty as OOD detection" of a route: one row per teacher and split, one column per score, the
    AUROC of :func:`kdpipe.routing.diagnostics.ood_auroc`; None for a route without it."""
    record = route.get("ood_auroc")
    if not record:
        return None
    scores = list(OOD_ORIENTATION)
    header = ["teacher", "split", "own rows", "other rows"]
    header += [("+" if OOD_ORIENTATION[s] > 0 else "−") + s for s in scores]
    rows = []
    for teacher in dict.fromkeys(t for split in record.values() for t in split):
        for split in (s for s in OOD_SPLITS if teacher in record.get(s, {})):
            entry = record[split][teacher]
            aurocs = ["—" if entry["auroc"].get(s) is None else f"{entry['auroc'][s]:.3f}" for s in scores]
            rows.append([teacher, split, str(entry["n_own"]), str(entry["n_other"]), *aurocs])
    table = markdown_table(header, rows, left=("teacher", "split"))
    return f"### Certainty as OOD detection (AUROC)\n\n{table}\n\n{OOD_NOTE}"


def routing_markdown(routes: list[dict], table: pd.DataFrame) -> str:
    parts = ["# Routing\n"]
    parts += [f"> **Warning** ({plain(r['route'])}): {plain(r['warning'])}\n" for r in routes if r.get("warning")]
    parts.append(
        "Routing: % of rows whose gold class's teacher gets the largest weight. Target: % of rows whose hard-routed "
        "distillation target predicts the gold class. The validation figures of the learned router are cross-fitted "
        "(each row routed by a router fitted without it). *gold labels*: the router reads gold labels (the learned "
        "router those of the validation split, the oracle every split's): a diagnostic or a ceiling, not MUKI.\n"
    )
    by_name = {route["route"]: route for route in routes}
    for name, rows in table.groupby("route", sort=False):
        lines = [
            "| router | routing val (%) | routing train (%) | target val (%) | target train (%) |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for row in rows.itertuples(index=False):
            label = f"**{plain(row.router)}** (chosen)" if row.chosen else plain(row.router)
            label += " · gold labels" if row.gold_labels else ""
            cells = (row.routing_validation, row.routing_train, row.target_validation, row.target_train)
            lines.append(f"| {label} | " + " | ".join("—" if pd.isna(v) else f"{100 * v:.1f}" for v in cells) + " |")
        parts.append(f"## {plain(name)}\n\n" + "\n".join(lines) + "\n")
        ood = ood_markdown(by_name.get(name, {}))
        if ood:
            parts.append(ood)
    return "\n".join(parts)


def plot_routing(routes: list[dict], path: Path) -> None:
    """Per route, grouped bars: each router's validation routing accuracy per gold class."""
    plt = pyplot()
    fig, axes = plt.subplots(len(routes), 1, figsize=(11, 3.6 * len(routes)), squeeze=False, layout="constrained")
    for ax, route in zip(axes[:, 0], routes):
        routers = {n: d for n, d in route["diagnostics"].items() if "validation" in d}
        classes = list(route["labels"])
        width = 0.8 / max(len(routers), 1)
        for i, (name, d) in enumerate(routers.items()):
            shares = [100 * d["validation"]["routing"]["per_class"].get(c, float("nan")) for c in classes]
            label = name + (" (chosen)" if name == route["router"] else "") + (" · gold" if d["gold_labels"] else "")
            ax.bar([j + i * width for j in range(len(classes))], shares, width, label=label)
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(classes))], classes)
        ax.set_ylim(0, 105)
        ax.set_ylabel("routed to its teacher (%)")
        ax.set_title(f"{route['route']}: validation rows sent to the teacher that owns their class", fontsize=10)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)  # beside the bars
    save(fig, path)
    plt.close(fig)


def write_routing(manifests: list[str | Path], out_dir: Path, warn_below: float = WARN_BELOW) -> list[dict]:
    """routing.tsv, routing.md and routing.png in ``out_dir``; returns the routes with their warnings at the
    threshold ``warn_below`` (for the summary)."""
    routes = read_routes(manifests, warn_below)
    table = routing_table(routes)
    with atomic_path(out_dir / "routing.tsv") as tmp:
        table.to_csv(tmp, sep="\t", index=False, float_format="%.6g")
    with atomic_path(out_dir / "routing.md") as tmp:
        tmp.write_text(routing_markdown(routes, table))
    plot_routing(routes, out_dir / "routing.png")
    return routes
