"""Start-up: a stage that runs no model imports neither torch nor transformers, which take seconds to import
(docs/design.md, "Compute"). Each check runs in a fresh interpreter, as a job does."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kdpipe.stages.catalog import STAGES
from tests.conftest import REPO

# Stages without a forward pass. route and route-transfer are not among them: their certainty and knn scores are
# computed with torch (float32, as the MC-dropout pass computed the cached columns); they import no transformers.
MODEL_FREE = (
    "prepare",
    "transfer",
    "ood",
    "signal-gather",
    "report",
    "evaluate-ensemble",
    "prompt-gather",
    "evaluate-prompted",
)
TORCH_ONLY = ("route", "route-transfer")
# Stages that run a model on the CPU alone (ONNX export and Runtime, serving profiles): they claim no GPU
CPU_MODELS = ("export", "quantize", "serve", "llm-import")


def imported_after(stage: str) -> set[str]:
    """Which of torch and transformers a fresh interpreter holds after importing the command line and the stage."""
    code = (
        f"import sys, kdpipe.cli, {STAGES[stage].module}; "
        "print(' '.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return set(result.stdout.split())


@pytest.mark.parametrize("stage", MODEL_FREE)
def test_model_free_stage_imports_no_torch(stage):
    assert not STAGES[stage].model
    assert imported_after(stage) == set()


@pytest.mark.parametrize("stage", TORCH_ONLY)
def test_routing_stage_imports_no_transformers(stage):
    assert imported_after(stage) == {"torch"}


def test_every_stage_is_classified():
    """A new stage without a model is added above (or imports torch for its arithmetic, and says so)."""
    assert {name for name, stage in STAGES.items() if not stage.model} == set(MODEL_FREE + TORCH_ONLY + CPU_MODELS)
