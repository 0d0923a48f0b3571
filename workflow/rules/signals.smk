# Teacher signals on one split (kdpipe/signals/catalog.py names each signal's files and module). A pass makes some
# signals of one teacher on one split (kdpipe/plan/passes.py): the teacher's shared forward pass every deterministic
# signal some job reads there, MC-dropout its own. With S = 1 (mc_dropout.shards, dump.shards unset or 1) a pass is
# one job that writes its signals' files, from a rule named after them (`mc`, `logits+pooled+hidden`...). With
# S > 1 (or `--set-scatter mc_dropout=S dump=S`) it runs as S shard jobs (rule signal_shard) and one gather job per
# signal (the rule named after it). The artifacts are byte-identical for any S (tested), so S is in no job's config
# slice; the parts are temp files. Meta-KD's prototype scores close the file. The helpers are in common.smk.

for _signals, _pairs in PASSES_WHOLE.items():
    # A whole pass (S = 1): its signals' files, written by the job itself (no gather job); it runs with the
    # threads and resources a profile sets for signal_shard.
    stage(
        "signal-pass",
        "A teacher signal pass over a whole split (S = 1), writing its signals' files.",
        rule_name=pass_rule(_signals),
        inputs={"teacher": TEACHER, "data": lambda wc: PLAN.split_data(wc.split)},
        outputs=pass_outputs(_signals),
        args={"out": lambda wc: SIGNALS.format(teacher=wc.teacher, split=wc.split)},
        log_file=f"{LOGS}/{pass_rule(_signals)}/{{teacher}}.{{split}}.log",
        wildcards=pair_constraints(_pairs),
        cached=True,
        early="mc" in _signals,
        job_size=(PASS_THREADS, PASS_RESOURCES),
        cfg=lambda wc, s=_signals: PLAN.pass_params(wc.teacher, wc.split, s),
        modules=PLAN.pass_modules(_signals),
    )

stage(
    "signal-shard",
    "One shard of a teacher signal pass (the shared forward pass, or MC-dropout) when it runs as S > 1 shards.",
    inputs={"teacher": TEACHER, "data": lambda wc: PLAN.split_data(wc.split)},
    outputs={"out_part": temp(directory(PART))},
    args={"shard": lambda wc: wc.scatteritem},
    log_file=f"{LOGS}/{{pass_name}}/{{teacher}}.{{split}}.{{scatteritem}}.log",
    wildcards={"pass_name": one_of(PASSES_SHARDED), "split": SIGNAL_SPLITS, **CLASSIFIER_TEACHERS},
    cfg=lambda wc: PLAN.pass_params(wc.teacher, wc.split, shard_signals(wc)),
    modules=lambda wc: PLAN.pass_modules(shard_signals(wc)),
)

for _signal in SIGNALS_SHARDED:
    # A signal gathered from the parts of its pass's shards into the files the catalog names (one rule per signal,
    # named after it: logits, mc, pooled, hidden, attentions, attentions_mean, domain).
    stage(
        "signal-gather",
        "A teacher signal gathered from the parts of its pass's shards.",
        rule_name=_signal,
        inputs={"parts": lambda wc, s=_signal: gather_parts(wc, s)},
        outputs=signal_outputs(_signal),
        args={"out": lambda wc: SIGNALS.format(teacher=wc.teacher, split=wc.split)},
        log_file=f"{LOGS}/{_signal}/{{teacher}}.{{split}}.log",
        wildcards={"split": SIGNAL_SPLITS, **CLASSIFIER_TEACHERS},
        cached=True,
        cfg=lambda wc, s=_signal: PLAN.signal_params(wc.teacher, wc.split, s),
        modules=PLAN.signal_modules(_signal),
    )

# A prompted teacher's passes (kdpipe/plan/prompted.py, kdpipe/signals/prompted.py) make its logits and mc signals and
# its prompt members' probabilities on every split something reads (its evaluation reads validation and test), from
# its imported model: one job per split (S = 1), or S shard jobs and one gather job as the dump section (or
# --set-scatter dump=S) says; the same bytes for any S. The few-shot examples of the transfer rows' pass come from
# the prepared dataset's train split.
PROMPT_INPUTS = {
    "model": lambda wc: PLAN.llm_dir(wc.teacher),
    "data": lambda wc: PLAN.split_data(wc.split),
    "shots": lambda wc: PLAN.prompt_shots(wc.split),
}
if PROMPT_PAIRS and shard_count("logits") == 1:
    stage(
        "prompt-pass",
        "A prompted teacher's pass over a whole split (S = 1): its logits, mc and prompt members.",
        rule_name="prompt_pass",
        inputs=PROMPT_INPUTS,
        outputs=PROMPT_OUTPUTS,
        args={"out": lambda wc: SIGNALS.format(teacher=wc.teacher, split=wc.split)},
        log_file=f"{LOGS}/prompt_pass/{{teacher}}.{{split}}.log",
        wildcards=pair_constraints(PROMPT_PAIRS),
        cached=True,
        early=True,
        job_size=(PASS_THREADS, PASS_RESOURCES),
        cfg=lambda wc: PLAN.prompt_params(wc.teacher, wc.split),
    )
elif PROMPT_PAIRS:
    stage(
        "prompt-shard",
        "One shard of a prompted teacher's pass (S > 1).",
        rule_name="prompt_shard",
        inputs=PROMPT_INPUTS,
        outputs={"out_part": temp(directory(PROMPT_PART))},
        args={"shard": lambda wc: wc.scatteritem},
        log_file=f"{LOGS}/prompt_shard/{{teacher}}.{{split}}.{{scatteritem}}.log",
        wildcards=pair_constraints(PROMPT_PAIRS),
        early=True,
        cfg=lambda wc: PLAN.prompt_params(wc.teacher, wc.split),
    )
    stage(
        "prompt-gather",
        "A prompted teacher's logits, mc and prompt members gathered from the parts of its pass's shards.",
        rule_name="prompt_gather",
        inputs={"parts": prompt_parts},
        outputs=PROMPT_OUTPUTS,
        args={"out": lambda wc: SIGNALS.format(teacher=wc.teacher, split=wc.split)},
        log_file=f"{LOGS}/prompt_gather/{{teacher}}.{{split}}.log",
        wildcards=pair_constraints(PROMPT_PAIRS),
        cached=True,
        early=True,
        cfg=lambda wc: PLAN.prompt_params(wc.teacher, wc.split),
    )

stage(
    "prototypes",
    "Meta-KD's prototype scores of the train rows, from the un-fine-tuned backbone's token-mean embeddings.",
    inputs={"data": DATA_DIR},
    outputs={"out": PROTOTYPES, "manifest": PROTOTYPES.replace(".parquet", ".json")},
    log_file=f"{LOGS}/prototypes.log",
    cached=True,
    cfg=PLAN.prototype_params(),
)
