"""The plan of a config that has passed every schema check, remembered between runs (docs/caching-and-reruns.md,
"What the workflow remembers between runs").

The schema checks depend on nothing but the config as given, the schema, kdpipe's plan code and the versions of
Snakemake and jsonschema, so a config that passed them is kept in ``.snakemake/kdpipe-config.json`` with its
defaults under a hash of all of these, and an unchanged rerun takes it from there instead of importing jsonschema
and checking again. Checks that read files (transfer files, the dump budget) run every time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from importlib import metadata
from pathlib import Path

import yaml

from kdpipe.core.fingerprint import fingerprint
from kdpipe.core.memo import JsonMemo
from kdpipe.plan import Plan
from kdpipe.plan.entries import validate_entry
from kdpipe.plan.numbers import check_numbers

CHECKS = ("kdpipe.plan", "kdpipe.plan.checked")  # the code that checks and plans a config (with all it imports)
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML has it: ten times faster


def checked_plan(config: dict, schema_path: Path, snakemake_validate: Callable[[], None]) -> Plan:
    """The :class:`~kdpipe.plan.Plan` of ``config`` after every schema check, with the schema's defaults filled into
    ``config`` in place (``snakemake_validate`` runs Snakemake's check of ``config``, which fills them in). Raises
    :class:`~kdpipe.core.store.KdpipeError` naming the first refused key."""
    schema_text = schema_path.read_bytes()
    schema = yaml.load(schema_text, Loader=LOADER)
    memo = JsonMemo("kdpipe-config.json", limit=16)
    key = _key(config, schema_text)
    checked = memo.get(key) if key else None
    if checked is not None:
        config.clear()
        config.update(checked)
        return Plan(config)  # no schema: its checks of each entry passed for this same config
    check_numbers(config, schema)  # before the schema, which refuses lr: 1e-3 (text to YAML) without saying why
    validate_entry(config, schema)  # one line naming the key (Snakemake's check below prints the schema entry)
    snakemake_validate()
    with_defaults = _as_json(config)
    plan = Plan(config, schema)
    if key and with_defaults is not None:
        memo.put(key, json.loads(with_defaults))
        memo.save()
    return plan


def _key(config: dict, schema_text: bytes) -> str | None:
    """A hash of everything the checks' outcome depends on, or None for a config that JSON cannot hold exactly."""
    text = _as_json(config)
    if text is None:
        return None
    versions = {name: _version(name) for name in ("snakemake", "jsonschema", "pyyaml")}
    digest = hashlib.sha256(text.encode() + b"\0" + schema_text + b"\0")
    digest.update(json.dumps(versions, sort_keys=True).encode() + fingerprint(*CHECKS).encode())
    return digest.hexdigest()


def _as_json(config: dict) -> str | None:
    """``config`` as JSON, in its own key order (the order of teachers and students matters), or None when JSON
    would not give the same value back (a date, a tuple, a key that is not a string)."""
    try:
        text = json.dumps(config)
    except (TypeError, ValueError):
        return None
    return text if json.loads(text) == config else None


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"
