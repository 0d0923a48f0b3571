rule prepare:
    """Read the dataset, deduplicate, split (stratified, seeded), assign row_ids."""
    output:
        data=directory(DATA_DIR),
    params:
        cfg=as_json(PLAN.prepare_params()),
        code=code("kdpipe.stages.prepare"),
    log:
        f"{LOGS}/prepare.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} prepare --params {params.cfg:q} --out {output.data} > {log} 2>&1"
