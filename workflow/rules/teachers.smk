rule finetune_teacher:
    """Fine-tune one teacher (on its class subset) with the shared training loop."""
    input:
        data=DATA_DIR,
        prototypes=lambda wc: PLAN.teacher_prototype_files(wc.teacher),
    output:
        model=directory(TEACHER),
    log:
        f"{LOGS}/finetune_teacher/{{teacher}}.log",
    cache: True
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    params:
        cfg=lambda wc: as_json(PLAN.teacher_params(wc.teacher)),
        code=lambda wc: code("kdpipe.stages.finetune_teacher", *PLAN.teacher_modules(wc.teacher)),
    shell:
        "python -m kdpipe --threads {threads} finetune-teacher --params {params.cfg:q} --data {input.data} --out {output.model}"
        " --prototypes {input.prototypes} > {log} 2>&1"
