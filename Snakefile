# kdpipe: knowledge distillation of fine-tuned language models as a cached workflow.
# data -> teachers -> MC-dropout -> dumps -> students -> evaluation -> report (see README.md, DESIGN in docs/).
import sys
from pathlib import Path

from snakemake.utils import min_version

min_version("9.18")
# kdpipe from this workflow's own folder (also when another workflow uses this one as a module), ahead of any other
# copy on sys.path, PYTHONPATH included (docs/design.md, "Which kdpipe a job runs")
sys.path.insert(0, str(Path(workflow.current_basedir).resolve()))


# The default experiment, unless --configfile names another: Snakemake would otherwise deep-merge the two
# (teachers and students of both).
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/teachers.smk"
include: "workflow/rules/signals.smk"
include: "workflow/rules/routes.smk"
include: "workflow/rules/students.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/exports.smk"
include: "workflow/rules/stages.smk"


rule all:
    default_target: True
    input:
        PLAN.targets(),
