"""Shared fixtures: a tiny prepared dataset (a few dozen BBC rows) and tiny random BERT models."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from kdpipe.data.prepare import prepare
from kdpipe.methods.registry import get_method, method_args

# A suite started under nohup, or as a background job of a non-interactive shell, ignores SIGHUP or SIGINT, and every
# process it starts inherits that: the tests that stop a job with those signals would see it run to the end. The
# tests' jobs get the signals' default handling, as under a terminal or Snakemake.
for _signal, _handler in ((signal.SIGHUP, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
    if signal.getsignal(_signal) == signal.SIG_IGN:
        signal.signal(_signal, _handler)

REPO = Path(__file__).resolve().parents[1]

TINY_DATASET = {
    "name": "tiny",
    "source": "builtin:bbc_news",
    "files": None,
    "format": "auto",
    "encoding": "utf-8",
    "text_column": "text",
    "text_pair_column": None,
    "label_column": "label",
    "domain_column": None,
    "split": {"validation": 0.2, "test": 0.2, "seed": 1},
    "max_rows": None,
    "max_per_class": 8,
    "dedup": True,
}

TINY_TEACHER = {
    "backbone": "builtin:tiny-bert",
    "classes": None,
    "epochs": 1,
    "lr": 1e-3,
    "batch_size": 8,
    "eval_batch_size": 32,
    "max_length": 32,
    "warmup_ratio": 0.1,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "seed": 0,
    "checkpoint_every": 0,
}


def student_job(config: dict) -> dict:
    """A student's params as the plan passes them to the distill stage: method_args completed with the method's
    declared defaults and the method's ``method_spec``."""
    method = config["method"]
    return {
        **config,
        "method_args": method_args(method, config.get("method_args")),
        "method_spec": get_method(method).job_spec(),
    }


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare(TINY_DATASET, out)
    return out


@pytest.fixture(autouse=True)
def _threads():
    """Two torch threads, or one in each of make test's side-by-side pytest processes (pytest-xdist), which would
    otherwise ask for more threads than the machine has cores."""
    torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


# The longest test files first, so that with `pytest -n 2 --dist loadfile --no-loadscope-reorder` (make test)
# neither worker is left with a long file at the end: the files of FIRST (longest first: SLURM's file waits on the
# cluster's status checks most of its time), then every other file with an end-to-end (slow) test, then the rest,
# each group in collection order. Without --no-loadscope-reorder, pytest-xdist would put the files with the most
# tests first instead (the SLURM file, with three, near the end).
FIRST = ("test_slurm.py", "test_workflow_trust.py", "test_workflow.py")


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(FIRST)}
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item):
        return rank.get(item.path.name, len(FIRST) + (item.path not in slow_files))

    items.sort(key=key)
