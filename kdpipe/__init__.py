"""kdpipe: knowledge distillation of fine-tuned language models as a cached Snakemake workflow.

The package holds all the logic; the Snakemake rules in ``workflow/`` only call ``python -m kdpipe <stage>``.
Importing ``kdpipe`` imports nothing heavy: each stage module is imported on demand by the CLI, so a stage's
code fingerprint (``kdpipe.core.fingerprint``) covers exactly the modules that stage uses.
"""

from pathlib import Path

__version__ = "0.1.0"
# The config schema, package data: the workflow validates every config against it (docs/configuration.md)
CONFIG_SCHEMA = Path(__file__).with_name("config.schema.yaml")
