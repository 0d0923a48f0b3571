"""Summarise experiments/uncertainty.yaml: per model family, the test accuracy, each uncertainty score's AUROC at
telling the held-out class's test rows from the in-distribution ones, FPR@95 and AURC of the best score, as mean ±
sample std over seeds (the ensemble's four members count as four single teachers); then the issue's goal checked for
every Hydra+ family: epistemic AUROC within 0.02 of the ensemble's, at least 0.05 above the single student's
entropy, at accuracy within 0.5 points of the ensemble's.

    .venv/bin/python experiments/uncertainty_summary.py [--results results]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

SCORES = ("max_prob", "entropy", "mutual_info", "mc_entropy", "mc_mutual_info")
ENSEMBLE, SINGLE_STUDENT = "full", "vkd_ens"


def families(results: Path) -> dict[str, list[dict]]:
    """{family: [(ood record, test record) merged per model]}: a family is a model name without its seed."""
    found = defaultdict(list)
    for path in sorted(results.glob("eval/*/ood.json")):
        ood = json.loads(path.read_text())
        test = json.loads(path.with_name("test.json").read_text())
        family = re.sub(r"\.seed\d+$", "", ood["model"])
        if family == ENSEMBLE:
            family = "full (one member)" if ood["kind"] == "teacher" else "full (ensemble, N = 4)"
        found[family].append({"ood": ood["ood"], "metrics": test["metrics"]})
    return found


def mean_sd(values: list[float], scale: float = 1.0, digits: int = 3) -> str:
    values = [v * scale for v in values if v is not None]
    if not values:
        return "—"
    sd = f" ± {np.std(values, ddof=1):.{digits}f}" if len(values) > 1 else ""
    return f"{np.mean(values):.{digits}f}{sd}"


def table(found: dict[str, list[dict]]) -> str:
    head = ["model", "runs", "accuracy %", *(f"AUROC {s}" for s in SCORES), "FPR@95 best", "AURC max_prob"]
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    for family, runs in found.items():
        cells = [family, str(len(runs)), mean_sd([r["metrics"]["accuracy"] for r in runs], 100, 1)]
        for score in SCORES:
            cells.append(mean_sd([(r["ood"]["scores"].get(score) or {}).get("auroc") for r in runs]))
        best = [max(r["ood"]["scores"].values(), key=lambda m: m["auroc"])["fpr95"] for r in runs]
        cells += [mean_sd(best), mean_sd([r["metrics"]["selective"]["aurc"]["max_prob"] for r in runs], 1, 4)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goal(found: dict[str, list[dict]]) -> str:
    def mean(family, key):
        runs = found[family]
        if key == "accuracy":
            return float(np.mean([r["metrics"]["accuracy"] for r in runs]))
        return float(np.mean([r["ood"]["scores"][key]["auroc"] for r in runs]))

    ensemble, accuracy = mean("full (ensemble, N = 4)", "mutual_info"), mean("full (ensemble, N = 4)", "accuracy")
    single = mean(SINGLE_STUDENT, "entropy")
    lines = [
        f"ensemble: mutual_info AUROC {ensemble:.3f}, accuracy {100 * accuracy:.1f}%; "
        f"single student ({SINGLE_STUDENT}) entropy AUROC {single:.3f}"
    ]
    for family in sorted(f for f in found if f.startswith("hp4")):
        auroc, acc = mean(family, "mutual_info"), mean(family, "accuracy")
        checks = [abs(auroc - ensemble) <= 0.02, auroc >= single + 0.05, abs(acc - accuracy) <= 0.005]
        lines.append(
            f"{family}: mutual_info AUROC {auroc:.3f} (ensemble {auroc - ensemble:+.3f}, single student "
            f"{auroc - single:+.3f}), accuracy {100 * acc:.1f}%: {'met' if all(checks) else 'not met'}"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=Path("results"), help="the results folder of the run")
    args = p.parse_args()
    found = families(args.results)
    if not found:
        raise SystemExit(f"{args.results}: no eval/*/ood.json; run experiments/uncertainty.yaml first")
    print(table(found))
    print()
    print(goal(found))


if __name__ == "__main__":
    main()
