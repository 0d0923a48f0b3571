# Students to ship (export, serving): each student export.students names as an ONNX graph and, with export.int8,
# quantised to int8 (results/exported/<student>.onnx, <student>.int8), evaluated like any model against its student
# (workflow/rules/evaluate.smk); and the serving profile of each model serving.models names, measured in a job that
# holds every core.

# Every core of a local run; on a cluster (no --cores) the threads a profile sets for serve, which should also give it
# a node of its own (profiles/slurm: --exclusive)
SERVE_THREADS = workflow.resource_settings.cores or workflow.resource_settings.overwrite_threads.get("serve", 1)

stage(
    "export",
    "A trained student as an ONNX graph (free batch and sequence axes), checked against it on validation texts.",
    inputs={"model": lambda wc: PLAN.export_source(wc.model), "data": DATA_DIR},
    outputs={"out": directory(EXPORTED)},
    log_file=f"{LOGS}/export/{{model}}.log",
    wildcards={"model": one_of([m for m, (_, precision) in PLAN.exported().items() if precision == "onnx"])},
    cfg=lambda wc: PLAN.export_params(wc.model),
)

stage(
    "quantize",
    "An ONNX graph quantised to int8 (dynamic), its card saying what that cost on the validation rows.",
    inputs={"model": lambda wc: PLAN.export_source(wc.model), "data": DATA_DIR},
    outputs={"out": directory(EXPORTED)},
    log_file=f"{LOGS}/quantize/{{model}}.log",
    wildcards={"model": one_of([m for m, (_, precision) in PLAN.exported().items() if precision == "int8"])},
    cfg=lambda wc: PLAN.export_params(wc.model),
)

stage(
    "serve",
    "A model's serving profile: batch-1 latency, throughput, peak memory and size, with the machine to itself.",
    inputs={"model": model_dir, "data": DATA_DIR},
    outputs={"out": SERVING},
    log_file=f"{LOGS}/serve/{{model}}.log",
    wildcards={"model": one_of(PLAN.serving_models())},
    cfg=lambda wc: PLAN.serving_params(wc.model),
    job_size=(SERVE_THREADS, {"mem_mb": 6000, "runtime": 30}),
)
