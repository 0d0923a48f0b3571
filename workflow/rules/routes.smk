# Routing (docs/routing.md): each row's score for every teacher of a knowledge-integration student, one job per set
# of teachers and router settings (PLAN.routes()), shared by every student that routes the same way. It reads only
# cached teacher signals and the data, so it is teacher-side and cached between workflows. The signals it declares
# (PLAN.route_inputs) are named per split in its config slice, and the job opens no other; the slice leaves out the
# display settings (routing.warn_below), which the report reads. The job says the routing warning itself, at the
# threshold the workflow puts in the jobs' environment (common.smk), so a new threshold reruns no route. A route linked
# from the cache runs no job: each student that reads it says the warning again before it trains (the distill rule).


rule route:
    """Score every train and validation row for each teacher; print the routing diagnostics of every router."""
    input:
        data=DATA_DIR,
        signals=lambda wc: PLAN.route_inputs(wc.route),
    output:
        train=f"{ROUTE}/train.parquet",
        validation=f"{ROUTE}/validation.parquet",
        manifest=f"{ROUTE}/route.json",
    log:
        f"{LOGS}/route/{{route}}.log",
    wildcard_constraints:
        route=one_of(PLAN.routes()),
    cache: True
    priority: ROUTE_CHAIN_PRIORITY
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        cfg=lambda wc: as_json(PLAN.route_params(wc.route)),
        code=code("kdpipe.stages.route"),
        signals_root=SIGNALS_ROOT,
    shell:
        # the diagnostics table and the warning go to the console as well as the log
        "python -m kdpipe --threads {threads} route --params {params.cfg:q} --code {params.code} --data {input.data}"
        " --signals-root {params.signals_root} --out $(dirname {output.manifest:q})"
        " 2>&1 | tee {log}"


rule route_transfer:
    """Score the transfer rows with a route's router, as it scores train rows (refitted on validation alone)."""
    input:
        data=DATA_DIR,
        transfer=TRANSFER_DIR,
        route=f"{ROUTE}/route.json",
        signals=lambda wc: PLAN.route_transfer_inputs(wc.route),
    output:
        scores=f"{ROUTE}/transfer.parquet",
        manifest=f"{ROUTE}/transfer.json",
    log:
        f"{LOGS}/route/{{route}}.transfer.log",
    wildcard_constraints:
        route=one_of(PLAN.transfer_routes()),
    cache: True
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        cfg=lambda wc: as_json(PLAN.route_transfer_params(wc.route)),
        code=code("kdpipe.stages.route_transfer"),
        signals_root=SIGNALS_ROOT,
    shell:
        "python -m kdpipe --threads {threads} route-transfer --params {params.cfg:q} --code {params.code} --data {input.data}"
        " --transfer {input.transfer} --signals-root {params.signals_root} --route $(dirname {input.route:q}) > {log} 2>&1"
