rule mc_dropout:
    """Offline MC-dropout uncertainty of one teacher on one split (T dropout-on passes as one enlarged batch)."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        mean=f"{SIGNALS}/mc.npy",
        scores=f"{SIGNALS}/mc.parquet",
        manifest=f"{SIGNALS}/mc.json",
    params:
        cfg=lambda wc: as_json(PLAN.mc_params(wc.split)),
        code=code("kdpipe.mc_dropout"),
    log:
        f"{LOGS}/mc_dropout/{{teacher}}.{{split}}.log",
    cache: True
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    shell:
        "{KDPIPE} --threads {threads} mc-dropout --params {params.cfg:q} --teacher {input.teacher} --data {input.data}"
        " --out-npy {output.mean} --out-parquet {output.scores} > {log} 2>&1"


rule dump_teacher:
    """Eval-mode teacher logits on one split, for distillation from the cache."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        logits=f"{SIGNALS}/logits.parquet",
        manifest=f"{SIGNALS}/logits.json",
    params:
        cfg=lambda wc: as_json(PLAN.dump_params(wc.split)),
        code=code("kdpipe.dump"),
    log:
        f"{LOGS}/dump_teacher/{{teacher}}.{{split}}.log",
    cache: True
    threads: 2
    resources:
        mem_mb=6000,
        runtime=60,
        gpu=1,
    shell:
        "{KDPIPE} --threads {threads} dump-teacher --params {params.cfg:q} --teacher {input.teacher} --data {input.data}"
        " --out-logits {output.logits} > {log} 2>&1"


rule dump_hidden:
    """Teacher hidden states of the layers the students' methods align with (float16 npy, memory flat in N)."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        hidden=f"{SIGNALS}/hidden.npy",
        manifest=f"{SIGNALS}/hidden.json",
    params:
        cfg=lambda wc: as_json(PLAN.feature_params(wc.teacher, wc.split, "hidden")),
        code=code("kdpipe.dump"),
    log:
        f"{LOGS}/dump_hidden/{{teacher}}.{{split}}.log",
    cache: True
    threads: 2
    resources:
        mem_mb=6000,
        runtime=60,
        gpu=1,
    shell:
        "{KDPIPE} --threads {threads} dump-feature --params {params.cfg:q} --teacher {input.teacher}"
        " --data {input.data} --out-npy {output.hidden} > {log} 2>&1"
