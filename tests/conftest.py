"""Shared fixtures: a tiny prepared dataset (a few dozen BBC rows) and tiny random BERT models."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
import yaml

from kdpipe.data.prepare import prepare
from kdpipe.data.settings import DatasetSettings
from kdpipe.evaluation.settings import EvalSettings
from kdpipe.methods.registry import get_method, method_args
from kdpipe.methods.settings import StudentSettings
from kdpipe.models.settings import StudentModel
from kdpipe.signals.settings import PassSettings, SignalSettings
from kdpipe.training.settings import TeacherSettings

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
    "hf_splits": None,
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


# The student keys the plan leaves out of every student's slice (or puts in only where they are set)
_NOT_IN_STUDENT_SLICES = ("seeds", "per_domain", "devices", "signals", "transfer")


def student_job(config: dict) -> dict:
    """A student's params as the plan passes them to the distill stage: ``student_defaults``' schema defaults for
    the keys ``config`` leaves out, method_args completed with the method's declared defaults, the method's
    ``method_spec``, and its teachers as a list."""
    method = config["method"]
    defaults = {k: v for k, v in schema_section("student_defaults").items() if k not in _NOT_IN_STUDENT_SLICES}
    return {
        **defaults,
        **config,
        "teachers": list(config.get("teachers") or []),
        "method_args": method_args(method, config.get("method_args")).to_dict(),
        "method_spec": get_method(method).job_spec(),
    }


def student_settings(config: dict) -> StudentSettings:
    """:func:`student_job` as the distill and cotrain stages read it."""
    return StudentSettings.from_params(student_job(config), "test student")


def schema_section(section: str) -> dict:
    """The config schema's defaults of ``section``'s keys (those that have one)."""
    from kdpipe.core.settings import schema_default

    keys = yaml.safe_load((REPO / "kdpipe/config.schema.yaml").read_text())["properties"][section]["properties"]
    return {key: schema_default(section, key) for key, spec in keys.items() if "default" in spec}


def dataset_settings(params: dict | None = None) -> DatasetSettings:
    """A ``dataset`` slice (:data:`TINY_DATASET` by default) as the prepare stage reads it."""
    return DatasetSettings.from_params(TINY_DATASET if params is None else params, "dataset")


def teacher_settings(params: dict | None = None) -> TeacherSettings:
    """A teacher's slice (:data:`TINY_TEACHER` by default) as the finetune_teacher stage reads it."""
    return TeacherSettings.from_params(TINY_TEACHER if params is None else params, "test teacher")


def signal_settings(signal: str, **params) -> SignalSettings:
    """One signal's slice (``split`` and ``batch_size`` at least, as ``params``) as a signal pass reads it."""
    return SignalSettings.from_params({"signal": signal, **params}, "test signal")


def run_one(settings: SignalSettings, teacher: Path, data: Path, out: Path) -> dict:
    """One signal over the whole split, in a pass of its own; returns its manifest."""
    from kdpipe.signals.shards import run_pass

    return run_pass(PassSettings(signals=(settings,)), teacher, data, out)[settings.signal]


def run_signal(signal: str, params: dict, teacher: Path, data: Path, out: Path) -> dict:
    """One signal (its slice ``params``, without or with ``signal``) over a whole split, in a pass of its own
    (:func:`run_one`); its manifest."""
    return run_one(signal_settings(signal, **{k: v for k, v in params.items() if k != "signal"}), teacher, data, out)


def eval_settings(**params) -> EvalSettings:
    """An evaluation's settings: ``params`` (``model`` and ``splits`` at least) over what a trained student's
    evaluation slice holds."""
    model = params["model"]
    base = {"base": model, "kind": "student", "method": None, "seed": 0, "batch_size": 8, "ece_bins": 5}
    return EvalSettings.from_params(base | params, "evaluate")


def model_spec(spec: dict) -> StudentModel:
    """A student's ``model`` entry as the models layer reads it."""
    return StudentModel.from_params(spec, "test model")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data") / "tiny"
    prepare(dataset_settings(), out)
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
