rule distill:
    """Train one student from cached teacher signals only (never a live teacher)."""
    input:
        data=DATA_DIR,
        signals=lambda wc: PLAN.signal_files(wc.student),
        prototypes=lambda wc: PLAN.prototype_files(wc.student),
        init=lambda wc: PLAN.init_dirs(wc.student),  # a second stage starts from its first stage
        route=lambda wc: PLAN.route_files(wc.student),  # a knowledge-integration student's teacher weights
        transfer=lambda wc: PLAN.transfer_inputs(wc.student),  # unlabelled rows it learns from
        teachers=lambda wc: PLAN.online_teacher_dirs(wc.student),  # signals: online: the teachers it runs
    output:
        model=directory(STUDENT),
    log:
        f"{LOGS}/distill/{{student}}.log",
    wildcard_constraints:
        student=one_of(PLAN.stage_students("distill")),
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=lambda wc: PLAN.devices(wc.student),  # one process per device
    params:
        cfg=lambda wc: as_json(PLAN.student_params(wc.student)),
        code=lambda wc: code("kdpipe.stages.distill", *PLAN.student_modules(wc.student)),
        signals_root=SIGNALS_ROOT,
        route=lambda wc: PLAN.route_dir(wc.student),
    shell:
        # a student that reads a route says its routing warning first (at the threshold in the jobs' environment, as
        # the route job, so a new threshold reruns no student), in its log and in Snakemake's output: a route linked
        # from the shared cache ran no job that said it
        "python -m kdpipe --threads {threads} --processes {resources.gpu} distill --params {params.cfg:q} --data {input.data} --signals-root {params.signals_root}"
        " --out {output.model} --prototypes {input.prototypes} --route {params.route} --transfer {input.transfer}"
        " --teacher-dirs {input.teachers}"
        " --inputs {input} --code {params.code} 2>&1 | tee {log}"
        " | {{ grep -F --line-buffered '[kdpipe] routing warning: ' >&2 || true; }}"


rule cotrain:
    """ProKT: train a student and a teacher (from the pre-trained backbone) together; nothing is cached."""
    input:
        data=DATA_DIR,
    output:
        model=directory(STUDENT),
        teacher=directory(COTRAINED),
    log:
        f"{LOGS}/cotrain/{{student}}.log",
    wildcard_constraints:
        student=one_of(PLAN.stage_students("cotrain")),
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=8000,
        runtime=240,
        gpu=lambda wc: PLAN.devices(wc.student),  # one process per device
    params:
        cfg=lambda wc: as_json(PLAN.student_params(wc.student)),
        code=lambda wc: code("kdpipe.stages.cotrain", *PLAN.student_modules(wc.student)),
    shell:
        "python -m kdpipe --threads {threads} --processes {resources.gpu} cotrain --params {params.cfg:q} --data {input.data} --out {output.model}"
        " --out-teacher {output.teacher} --inputs {input} --code {params.code} > {log} 2>&1"
