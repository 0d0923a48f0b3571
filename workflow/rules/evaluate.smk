# Evaluation (kdpipe.evaluation) and the report (kdpipe.report).

stage(
    "evaluate",
    "Accuracy, macro-F1, NLL, ECE, Brier, selective prediction and predictions of one model on every split it is "
    "evaluated on, and its OOD detection (evaluate.ood), the model loaded once (one job per model).",
    inputs={
        "model": model_dir,
        "data": DATA_DIR,
        "ood": PLAN.ood_inputs(),
        # an exported model is compared with its student's predictions
        "references": lambda wc: [
            f"{folder}/{split}.predictions.parquet"
            for folder in PLAN.export_reference(wc.model)
            for split in PLAN.eval_splits()
        ],
    },
    outputs={
        "out_json": [f"{EVAL.format(model='{model}', split=s)}.json" for s in PLAN.eval_splits()],
        "out_predictions": [f"{EVAL.format(model='{model}', split=s)}.predictions.parquet" for s in PLAN.eval_splits()],
    },
    args={"reference": lambda wc: PLAN.export_reference(wc.model)},
    log_file=f"{LOGS}/evaluate/{{model}}.log",
    # (where a prompted teacher exists, it is evaluated by its own rule below)
    wildcards={"model": one_of(PLAN.inferred_models())} if PLAN.prompted_teachers() else None,
    cfg=lambda wc: PLAN.eval_params(wc.model),
    modules=lambda wc: PLAN.model_modules(wc.model),
)

stage(
    "evaluate-prompted",
    "A prompted teacher evaluated like any model on every split, from its passes' prompt members (the members' "
    "mean its prediction, their spread its uncertainty).",
    inputs={"data": DATA_DIR, "members": lambda wc: PLAN.prompt_members(wc.model)},
    outputs={
        "out_json": [f"{EVAL.format(model='{model}', split=s)}.json" for s in PLAN.eval_splits()],
        "out_predictions": [f"{EVAL.format(model='{model}', split=s)}.predictions.parquet" for s in PLAN.eval_splits()],
    },
    log_file=f"{LOGS}/evaluate/{{model}}.log",
    wildcards={"model": one_of(PLAN.prompted_teachers())},
    cfg=lambda wc: PLAN.eval_params(wc.model),
)

stage(
    "evaluate-ensemble",
    "An ensemble of teachers (its members' mean probabilities), or the teachers' oracle (each row from the teacher "
    "that owns its gold class), on every split, from its members' saved predictions (no inference).",
    inputs={
        "members": lambda wc: [
            f"{EVAL.format(model=m, split=s)}.predictions.parquet"
            for s in PLAN.eval_splits()
            for m in PLAN.combined(wc.ensemble)
        ],
        "evals": lambda wc: [
            f"{EVAL.format(model=m, split=s)}.json" for s in PLAN.eval_splits() for m in PLAN.combined(wc.ensemble)
        ],
    },
    outputs={
        "out_json": [f"{EVAL.format(model='{ensemble}', split=s)}.json" for s in PLAN.eval_splits()],
        "out_predictions": [
            f"{EVAL.format(model='{ensemble}', split=s)}.predictions.parquet" for s in PLAN.eval_splits()
        ],
    },
    log_file=f"{LOGS}/evaluate/{{ensemble}}.log",
    cfg=lambda wc: PLAN.eval_params(wc.ensemble),
)

stage(
    "report",
    "Summary table and plots of every model (rendered by `snakemake --report`).",
    inputs={
        "evals": [f"{EVAL.format(model=m, split=s)}.json" for m in PLAN.models() for s in PLAN.eval_splits()],
        "predictions": [
            f"{EVAL.format(model=m, split=s)}.predictions.parquet" for m in PLAN.models() for s in PLAN.eval_splits()
        ],
        "routes": [f"{ROUTE.format(route=r)}/route.json" for r in PLAN.routes()],
        "models": PLAN.trained_models(),
        "serving": [SERVING.format(model=model) for model in PLAN.serving_models()],
    },
    outputs=dict(
        **ROUTING_REPORT,
        **EXPORTED_REPORT,
        **UNCERTAINTY_REPORT,
        **TRANSFER_REPORT,
        **OOD_REPORT,
        html=report(
            f"{REPORT}/summary.html",
            caption="../report/summary.rst",
            category="Summary",
            labels={"figure": "1 comparison table"},
        ),
        landing=f"{REPORT}/landing.html",
        tsv=report(
            f"{REPORT}/summary.tsv",
            caption="../report/summary_tsv.rst",
            category="Summary",
            labels={"figure": "8 table as TSV"},
        ),
        md=f"{REPORT}/summary.md",
        chart=report(
            f"{REPORT}/metrics.png",
            caption="../report/metrics.rst",
            category="Summary",
            labels={"figure": "2 metrics"},
        ),
        cost=report(
            f"{REPORT}/cost.png",
            caption="../report/cost.rst",
            category="Summary",
            labels={"figure": "3 cost against accuracy"},
        ),
        curves=report(
            f"{REPORT}/curves.png",
            caption="../report/curves.rst",
            category="Summary",
            labels={"figure": "4 training curves"},
        ),
        confusion=report(
            f"{REPORT}/confusion.png",
            caption="../report/confusion.rst",
            category="Summary",
            labels={"figure": "5 confusion matrices"},
        ),
        reliability=report(f"{REPORT}/reliability.png", caption="../report/reliability.rst", category="Calibration"),
    ),
    args={"out": lambda wildcards, output: Path(output.tsv).parent, "title": PLAN.report_title()},
    log_file=f"{LOGS}/report.log",
    cfg=PLAN.report_params(),
)
