rule finetune_teacher:
    """Fine-tune one teacher (on its class subset) with the shared training loop."""
    input:
        data=DATA_DIR,
        prototypes=lambda wc: PLAN.teacher_prototype_files(wc.teacher),
    output:
        model=directory(TEACHER),
    log:
        f"{LOGS}/finetune_teacher/{{teacher}}.log",
    wildcard_constraints:
        teacher=one_of([t for t in PLAN.teachers if not PLAN.imported(t)]),
    cache: True
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=lambda wc: PLAN.devices(wc.teacher),  # one process per device
    params:
        cfg=lambda wc: as_json(PLAN.teacher_params(wc.teacher)),
        code=lambda wc: code("kdpipe.stages.finetune_teacher", *PLAN.teacher_modules(wc.teacher)),
    shell:
        "python -m kdpipe --threads {threads} --processes {resources.gpu} finetune-teacher --params {params.cfg:q} --data {input.data} --out {output.model}"
        " --prototypes {input.prototypes} --inputs {input} --code {params.code} > {log} 2>&1"


rule import_teacher:
    """Use a fine-tuned checkpoint as a teacher as it is (`checkpoint` with `finetune: false`): same artifact, no
    training."""
    input:
        data=DATA_DIR,
    output:
        model=directory(TEACHER),
    log:
        f"{LOGS}/import_teacher/{{teacher}}.log",
    wildcard_constraints:
        teacher=one_of(PLAN.imported_teachers()),
    cache: True
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=60,
        gpu=1,
    params:
        cfg=lambda wc: as_json(PLAN.teacher_params(wc.teacher)),
        code=code("kdpipe.stages.import_teacher"),
    shell:
        "python -m kdpipe --threads {threads} import-teacher --params {params.cfg:q} --code {params.code} --data {input.data} --out {output.model}"
        " > {log} 2>&1"
