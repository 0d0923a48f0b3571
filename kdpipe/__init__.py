"""kdpipe: knowledge distillation of fine-tuned language models as a cached Snakemake workflow.

The package holds all the logic; the Snakemake rules in ``workflow/`` only call ``python -m kdpipe <stage>``.
Importing ``kdpipe`` imports nothing heavy: each stage module is imported on demand by the CLI, so a stage's
code fingerprint (``kdpipe.core.fingerprint``) covers exactly the modules that stage uses.
"""

__version__ = "0.1.0"
