"""Where every artifact lives, relative to the workflow directory (docs/design.md, "Artifacts")."""

DATA = "results/data/{dataset}"
TRANSFER = "results/transfer/{dataset}"  # the unlabelled transfer rows, one split "transfer" (kdpipe.data.transfer)
OOD_DATA = "results/ood/{dataset}"  # an external OOD set, one split "ood" (evaluate.ood.source, kdpipe.data.ood)
TEACHER = "results/teachers/{teacher}"
LLM = "results/llm/{llm}"  # a prompted teacher's causal LM, imported once per source (kdpipe.models.causal_lm)
SIGNALS_ROOT = "results/signals"
SIGNALS = SIGNALS_ROOT + "/{teacher}/{split}"
STUDENT = "results/students/{student}"
COTRAINED = "results/cotrained/{student}"  # ProKT's teacher, trained with the student (evaluated as <student>.teacher)
ROUTE = "results/routes/{route}"  # a route: each row's teacher scores (kdpipe.routing.artifact)
PROTOTYPES = "results/prototypes/train.parquet"  # Meta-KD's prototype scores of the train rows (+ train.json)
EVAL = "results/eval/{model}/{split}"
EXPORTED = "results/exported/{model}"  # an exported student: "<student>.onnx" or "<student>.int8"
SERVING = "results/serving/{model}.json"  # a model's serving profile (kdpipe.models.serving)
ORACLE = "oracle"  # the model name of the teachers' oracle (evaluate.oracle), evaluated like an ensemble
REPORT = "results/report"
LOGS = "results/logs"
# The folders of trained models, each with the ``.resume/`` folder of its training jobs (kdpipe.core.finished)
TRAINED_ROOTS = [template.rsplit("/", 1)[0] for template in (TEACHER, STUDENT, COTRAINED)]
