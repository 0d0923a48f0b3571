# Teachers: fine-tuned here with the shared training loop, imported from a fine-tuned checkpoint as they are, or
# prompted LLMs (their model imported once per source; their passes are in signals.smk).

stage(
    "finetune-teacher",
    "Fine-tune one teacher (on its class subset) with the shared training loop.",
    inputs={"data": DATA_DIR, "prototypes": lambda wc: PLAN.teacher_prototype_files(wc.teacher)},
    outputs={"out": directory(TEACHER)},
    log_file=f"{LOGS}/finetune_teacher/{{teacher}}.log",
    wildcards={"teacher": one_of([t for t in PLAN.classifier_teachers() if not PLAN.imported(t)])},
    cached=True,
    cfg=lambda wc: PLAN.teacher_params(wc.teacher),
    modules=lambda wc: PLAN.teacher_modules(wc.teacher),
)

stage(
    "import-teacher",
    "Use a fine-tuned checkpoint as a teacher as it is (`checkpoint` with `finetune: false`): no training.",
    inputs={"data": DATA_DIR},
    outputs={"out": directory(TEACHER)},
    log_file=f"{LOGS}/import_teacher/{{teacher}}.log",
    wildcards={"teacher": one_of(PLAN.imported_teachers())},
    cached=True,
    cfg=lambda wc: PLAN.teacher_params(wc.teacher),
)

stage(
    "llm-import",
    "Import a prompted teacher's causal language model (a local folder, a GGUF file or a hub name) once, as "
    "safetensors with its tokenizer, for every pass of every teacher that names it.",
    outputs={"out": directory(LLM)},
    log_file=f"{LOGS}/llm_import/{{llm}}.log",
    wildcards={"llm": one_of(PLAN.llms())},
    cached=True,
    cfg=lambda wc: PLAN.llm_params(wc.llm),
)
