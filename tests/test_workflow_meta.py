"""End to end: Meta-KD (issue 6) on a generated multi-domain dataset: prototype scores, a meta-teacher beside a plain
teacher, the meta-teacher's attention / hidden-state / domain dumps, two-stage per-domain students (one reading
every attention head, one narrower reading head-averaged attentions through a projection) and a per-domain
vanilla-KD baseline; then what an edit reruns, read from Snakemake's dry-run job lists."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.test_workflow import edited_config, finished_project, planned_jobs, signal_jobs

pytestmark = pytest.mark.slow

CONFIG = "tests/configs/tiny_domains.yaml"
ITEMS = {"books": ["novel", "story", "author", "chapter", "plot"],
         "dvd": ["movie", "film", "actor", "scene", "director"],
         "kitchen": ["blender", "kettle", "pan", "knife", "toaster"]}
WORDS = {"pos": ["great", "wonderful", "excellent", "lovely"], "neg": ["awful", "boring", "terrible", "poor"]}


def domain_dataset(per_domain: int = 30) -> pd.DataFrame:
    """Reviews of three domains (their own nouns), positive or negative (shared sentiment words), all distinct."""
    rows = []
    for domain, items in ITEMS.items():
        for i in range(per_domain):
            label = ("pos", "neg")[i % 2]
            words = WORDS[label]
            text = (f"review {i} of {domain}: the {items[i % 5]} was {words[i % 4]} and the {items[(i + 2) % 5]} "
                    f"felt {words[(i + 1) % 4]}")
            rows.append({"text": text, "label": label, "domain": domain})
    return pd.DataFrame(rows)


def write_domains(project):
    (project / "data").mkdir()
    domain_dataset().to_csv(project / "data/domains.csv", index=False)
