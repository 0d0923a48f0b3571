# Students: distilled from cached teacher signals only (never a live teacher, but for `signals: online`), or, for
# ProKT, trained together with their teacher. A student that reads a route says its routing warning before it trains
# (at the threshold in the jobs' environment, as the route job, so a new threshold reruns no student), in its log and
# on the console: a route linked from the shared cache ran no job that said it.

stage(
    "distill",
    "Train one student from cached teacher signals only (never a live teacher).",
    inputs={
        "data": DATA_DIR,
        "signals": lambda wc: PLAN.signal_files(wc.student),
        "prototypes": lambda wc: PLAN.prototype_files(wc.student),
        "init": lambda wc: PLAN.init_dirs(wc.student),  # a second stage starts from its first stage
        "route_files": lambda wc: PLAN.route_files(wc.student),  # a knowledge-integration student's teacher weights
        "transfer": lambda wc: PLAN.transfer_inputs(wc.student),  # unlabelled rows it learns from
        "teacher_dirs": lambda wc: PLAN.online_teacher_dirs(wc.student),  # signals: online: the teachers it runs
    },
    outputs={"out": directory(STUDENT)},
    args={"signals_root": SIGNALS_ROOT, "route": lambda wc: PLAN.route_dir(wc.student)},
    log_file=f"{LOGS}/distill/{{student}}.log",
    wildcards={"student": one_of(PLAN.stage_students("distill"))},
    cfg=lambda wc: PLAN.student_params(wc.student),
    modules=lambda wc: PLAN.student_modules(wc.student),
)

stage(
    "cotrain",
    "ProKT: train a student and a teacher (from the pre-trained backbone) together; nothing is cached.",
    inputs={"data": DATA_DIR},
    outputs={"out": directory(STUDENT), "out_teacher": directory(COTRAINED)},
    log_file=f"{LOGS}/cotrain/{{student}}.log",
    wildcards={"student": one_of(PLAN.stage_students("cotrain"))},
    cfg=lambda wc: PLAN.student_params(wc.student),
    modules=lambda wc: PLAN.student_modules(wc.student),
)
