rule prepare:
    """Read the dataset, deduplicate, split (stratified, seeded), assign row_ids."""
    output:
        data=directory(DATA_DIR),
    log:
        f"{LOGS}/prepare.log",
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        cfg=as_json(PLAN.prepare_params()),
        code=code("kdpipe.stages.prepare"),
    shell:
        "python -m kdpipe --threads {threads} prepare --params {params.cfg:q} --out {output.data} > {log} 2>&1"


rule transfer:
    """The unlabelled transfer rows: read, drop empty, repeated and evaluation texts, cap, number after the data."""
    input:
        data=DATA_DIR,
    output:
        transfer=directory(TRANSFER_DIR),
    log:
        f"{LOGS}/transfer.log",
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        cfg=as_json(PLAN.transfer_params()),
        code=code("kdpipe.stages.transfer"),
    shell:
        "python -m kdpipe transfer --params {params.cfg:q} --data {input.data} --out {output.transfer} > {log} 2>&1"


rule ood:
    """An external OOD set (evaluate.ood.source): read, drop empty, repeated, dataset and transfer texts."""
    input:
        data=DATA_DIR,
        transfer=[TRANSFER_DIR] if PLAN.has_transfer() else [],
    output:
        ood=directory(OOD_DIR),
    log:
        f"{LOGS}/ood.log",
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        cfg=lambda wc: as_json(PLAN.ood_params()),
        code=code("kdpipe.stages.ood"),
    shell:
        "python -m kdpipe ood --params {params.cfg:q} --data {input.data} --transfer {input.transfer}"
        " --out {output.ood} > {log} 2>&1"
