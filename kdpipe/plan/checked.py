"""The plan of a config that has passed every check of its entries (docs/configuration.md): the numbers first, each
entry against the schema with one line naming a refused key, then Snakemake's own check, which fills in the
schema's defaults."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml

from kdpipe.plan import Plan
from kdpipe.plan.entries import validate_entry
from kdpipe.plan.numbers import check_numbers

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: ten times faster


def checked_plan(config: dict, schema_path: Path, snakemake_validate: Callable[[], None]) -> Plan:
    """The :class:`~kdpipe.plan.Plan` of ``config`` after every schema check, with the schema's defaults filled into
    ``config`` in place (``snakemake_validate`` runs Snakemake's check of ``config``, which fills them in). Raises
    :class:`~kdpipe.core.store.KdpipeError` naming the first refused key."""
    schema = yaml.load(schema_path.read_bytes(), Loader=LOADER)
    check_numbers(config, schema)  # before the schema, which refuses lr: 1e-3 (text to YAML) without saying why
    validate_entry(config, schema)  # one line naming the key (Snakemake's check below prints the schema entry)
    snakemake_validate()
    return Plan(config, schema)
