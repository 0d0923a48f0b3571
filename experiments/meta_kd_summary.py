"""Summarise experiments/meta_kd.yaml over domains: per student family, each seed's mean over the domains of its
test accuracy and NLL, then mean ± sample std over seeds; and the two teachers compared on the same test rows
(exact McNemar test on the rows one gets right and the other wrong).

    .venv/bin/python experiments/meta_kd_summary.py [--results results] [--families meta_kd kd_meta kd_plain]
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import binomtest


def family_table(results: Path, families: list[str]) -> pd.DataFrame:
    rows = []
    for family in families:
        per_seed = defaultdict(list)
        for path in sorted(results.glob(f"eval/{family}.*/test.json")):
            record = json.loads(path.read_text())
            seed = re.search(r"\.seed(\d+)$", record["model"])
            per_seed[int(seed[1]) if seed else 0].append(record["metrics"])
        domains = {len(v) for v in per_seed.values()}
        accuracy = [np.mean([m["accuracy"] for m in v]) for v in per_seed.values()]
        nll = [np.mean([m["nll"] for m in v]) for v in per_seed.values()]
        rows.append(
            {
                "family": family,
                "seeds": len(per_seed),
                "domains": domains.pop() if len(domains) == 1 else domains,
                "accuracy %": f"{100 * np.mean(accuracy):.1f} ± {100 * np.std(accuracy, ddof=1):.1f}",
                "NLL": f"{np.mean(nll):.3f} ± {np.std(nll, ddof=1):.3f}",
            }
        )
    return pd.DataFrame(rows)


def mcnemar(results: Path, a: str, b: str) -> str:
    one = pd.read_parquet(results / f"eval/{a}/test.predictions.parquet").set_index("row_id")
    two = pd.read_parquet(results / f"eval/{b}/test.predictions.parquet").set_index("row_id").loc[one.index]
    only_a, only_b = int((one["correct"] & ~two["correct"]).sum()), int((~one["correct"] & two["correct"]).sum())
    p = binomtest(only_a, only_a + only_b).pvalue
    return (
        f"{a} {100 * one['correct'].mean():.1f}% vs {b} {100 * two['correct'].mean():.1f}% on {len(one)} test rows: "
        f"{only_a} rows only {a} gets right, {only_b} only {b}; exact McNemar p = {p:.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--families", nargs="+", default=["meta_kd", "kd_meta", "kd_plain"])
    parser.add_argument("--teachers", nargs=2, default=["meta", "plain"])
    args = parser.parse_args()
    print(family_table(args.results, args.families).to_markdown(index=False))
    print()
    print(mcnemar(args.results, *args.teachers))


if __name__ == "__main__":
    main()
