rule distill:
    """Train one student from cached teacher signals only (never a live teacher)."""
    input:
        data=DATA_DIR,
        signals=lambda wc: PLAN.signal_files(wc.student),
    output:
        model=directory(STUDENT),
    params:
        cfg=lambda wc: as_json(PLAN.student_params(wc.student)),
        code=lambda wc: code("kdpipe.distill", PLAN.method_module(wc.student)),
        signals_root=SIGNALS.split("/{teacher}")[0],
    log:
        f"{LOGS}/distill/{{student}}.log",
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} distill --params {params.cfg:q} --data {input.data} --signals-root {params.signals_root}"
        " --out {output.model} > {log} 2>&1"
