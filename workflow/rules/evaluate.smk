rule evaluate:
    """Accuracy, macro-F1, NLL, ECE, Brier, selective prediction and predictions of one model on every split it is
    evaluated on, and its OOD detection (evaluate.ood), the model loaded once (one job per model)."""
    input:
        model=model_dir,
        data=DATA_DIR,
        ood=PLAN.ood_inputs(),
    output:
        metrics=[f"{EVAL.format(model='{model}', split=s)}.json" for s in PLAN.eval_splits()],
        predictions=[f"{EVAL.format(model='{model}', split=s)}.predictions.parquet" for s in PLAN.eval_splits()],
    log:
        f"{LOGS}/evaluate/{{model}}.log",
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30 * len(PLAN.eval_splits()),
        gpu=1,
    params:
        cfg=lambda wc: as_json(PLAN.eval_params(wc.model)),
        code=lambda wc: code("kdpipe.stages.evaluate", *PLAN.model_modules(wc.model)),
    shell:
        "python -m kdpipe --threads {threads} evaluate --params {params.cfg:q} --model {input.model} --data {input.data}"
        " --ood {input.ood} --out-json {output.metrics} --out-predictions {output.predictions} > {log} 2>&1"


rule evaluate_ensemble:
    """An ensemble of teachers (its members' mean probabilities), or the teachers' oracle (each row from the teacher
    that owns its gold class), on every split: metrics and predictions from the members' saved predictions (no
    inference)."""
    input:
        members=lambda wc: [
            f"{EVAL.format(model=m, split=s)}.predictions.parquet"
            for s in PLAN.eval_splits()
            for m in PLAN.combined(wc.ensemble)
        ],
        evals=lambda wc: [
            f"{EVAL.format(model=m, split=s)}.json" for s in PLAN.eval_splits() for m in PLAN.combined(wc.ensemble)
        ],
    output:
        metrics=[f"{EVAL.format(model='{ensemble}', split=s)}.json" for s in PLAN.eval_splits()],
        predictions=[f"{EVAL.format(model='{ensemble}', split=s)}.predictions.parquet" for s in PLAN.eval_splits()],
    log:
        f"{LOGS}/evaluate/{{ensemble}}.log",
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        cfg=lambda wc: as_json(PLAN.eval_params(wc.ensemble)),
        code=code("kdpipe.stages.evaluate_ensemble"),
    shell:
        "python -m kdpipe --threads {threads} evaluate-ensemble --params {params.cfg:q} --members {input.members}"
        " --out-json {output.metrics} --out-predictions {output.predictions} > {log} 2>&1"


rule report:
    """Summary table and plots of every model (rendered by `snakemake --report`)."""
    input:
        evals=[f"{EVAL.format(model=m, split=s)}.json" for m in PLAN.models() for s in PLAN.eval_splits()],
        predictions=[
            f"{EVAL.format(model=m, split=s)}.predictions.parquet" for m in PLAN.models() for s in PLAN.eval_splits()
        ],
        routes=[f"{ROUTE.format(route=r)}/route.json" for r in PLAN.routes()],
        models=PLAN.trained_models(),
    output:
        **ROUTING_REPORT,
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
    log:
        f"{LOGS}/report.log",
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        out=lambda wildcards, output: Path(output.tsv).parent,
        cfg=as_json(PLAN.report_params()),
        title=PLAN.report_title(),
        code=code("kdpipe.stages.report"),
    shell:
        "python -m kdpipe report --params {params.cfg:q} --out {params.out} --evals {input.evals}"
        " --routes {input.routes} --models {input.models} --title {params.title:q} > {log} 2>&1"
