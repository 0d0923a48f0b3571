# Routing (docs/routing.md): each row's score for every teacher of a knowledge-integration student, one job per set
# of teachers and router settings (PLAN.routes()), shared by every student that routes the same way. It reads only
# cached teacher signals and the data, so it is teacher-side and cached between workflows. The signals it declares
# (PLAN.route_inputs) are named per split in its config slice, and the job opens no other; the slice leaves out the
# display settings (routing.warn_below), which the report reads. The job says the routing diagnostics and warning
# itself (in its log and on the console), at the threshold the workflow puts in the jobs' environment (common.smk),
# so a new threshold reruns no route. A route linked from the cache runs no job: each student that reads it says
# the warning again before it trains.

stage(
    "route",
    "Score every train and validation row for each teacher; say the routing diagnostics of every router.",
    inputs={"data": DATA_DIR, "signals": lambda wc: PLAN.route_inputs(wc.route)},
    outputs={
        "train": f"{ROUTE}/train.parquet",
        "validation": f"{ROUTE}/validation.parquet",
        "manifest": f"{ROUTE}/route.json",
    },
    args={"signals_root": SIGNALS_ROOT, "out": lambda wc: ROUTE.format(route=wc.route)},
    log_file=f"{LOGS}/route/{{route}}.log",
    wildcards={"route": one_of(PLAN.routes())},
    cached=True,
    early=True,
    cfg=lambda wc: PLAN.route_params(wc.route),
)

stage(
    "route-transfer",
    "Score the transfer rows with a route's router, as it scores train rows (refitted on validation alone).",
    inputs={
        "data": DATA_DIR,
        "transfer": TRANSFER_DIR,
        "route_manifest": f"{ROUTE}/route.json",
        "signals": lambda wc: PLAN.route_transfer_inputs(wc.route),
    },
    outputs={"scores": f"{ROUTE}/transfer.parquet", "manifest": f"{ROUTE}/transfer.json"},
    args={"signals_root": SIGNALS_ROOT, "route": lambda wc: ROUTE.format(route=wc.route)},
    log_file=f"{LOGS}/route/{{route}}.transfer.log",
    wildcards={"route": one_of(PLAN.transfer_routes())},
    cached=True,
    cfg=lambda wc: PLAN.route_transfer_params(wc.route),
)
