# Teacher signals on one split (kdpipe/signals/catalog.py names each signal's files and module). A pass makes some
# signals of one teacher on one split (kdpipe/plan/passes.py): the teacher's shared forward pass every deterministic
# signal some job reads there, MC-dropout its own. With S = 1 (mc_dropout.shards, dump.shards unset or 1) a pass is
# one job that writes its signals' files, from a rule named after them (`mc`, `logits+pooled+hidden`...). With
# S > 1 (or `--set-scatter mc_dropout=S dump=S`) it runs as S shard jobs (rule signal_shard) and one gather job per
# signal (the rule named after it). The artifacts are byte-identical for any S (tested), so S is in no job's config
# slice; the parts are temp files. Meta-KD's prototype scores close the file. The helpers are in common.smk.


for _signals, _pairs in PASSES_WHOLE.items():

    rule:
        # A whole pass (S = 1): its signals' files, written by the job itself (no gather job).
        name:
            pass_rule(_signals)
        input:
            teacher=TEACHER,
            data=lambda wc: PLAN.split_data(wc.split),
        output:
            **pass_outputs(_signals),
        log:
            f"{LOGS}/{pass_rule(_signals)}/{{teacher}}.{{split}}.log",
        wildcard_constraints:
            **pair_constraints(_pairs),
        cache: True
        priority: ROUTE_CHAIN_PRIORITY if "mc" in _signals else 0
        conda:
            ENV
        threads: PASS_THREADS
        resources:
            **PASS_RESOURCES,
        params:
            cfg=lambda wc, s=_signals: as_json(PLAN.pass_params(wc.teacher, wc.split, s)),
            code=code("kdpipe.stages.signal_pass", *PLAN.pass_modules(_signals)),
        shell:
            "python -m kdpipe --threads {threads} signal-pass --params {params.cfg:q} --code {params.code} --teacher {input.teacher}"
            f" --data {{input.data}} --out {PASS_FOLDER} > {{log}} 2>&1"


rule signal_shard:
    """One shard of a teacher signal pass (the shared forward pass, or MC-dropout) when it runs as S > 1 shards."""
    input:
        teacher=TEACHER,
        data=lambda wc: PLAN.split_data(wc.split),
    output:
        part=temp(directory(PART)),
    log:
        f"{LOGS}/{{pass_name}}/{{teacher}}.{{split}}.{{scatteritem}}.log",
    wildcard_constraints:
        pass_name=one_of(PASSES_SHARDED),
        split=SIGNAL_SPLITS,
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    params:
        cfg=lambda wc: as_json(PLAN.pass_params(wc.teacher, wc.split, shard_signals(wc))),
        code=lambda wc: code("kdpipe.stages.signal_shard", *PLAN.pass_modules(shard_signals(wc))),
    shell:
        "python -m kdpipe --threads {threads} signal-shard --params {params.cfg:q} --code {params.code} --teacher {input.teacher}"
        " --data {input.data} --shard {wildcards.scatteritem} --out-part {output.part} > {log} 2>&1"


for _signal in SIGNALS_SHARDED:

    rule:
        # A signal gathered from the parts of its pass's shards into the files the catalog names (one rule per
        # signal, named after it: logits, mc, pooled, hidden, attentions, attentions_mean, domain).
        name:
            _signal
        input:
            parts=lambda wc, s=_signal: gather_parts(wc, s),
        output:
            **signal_outputs(_signal),
        log:
            f"{LOGS}/{_signal}/{{teacher}}.{{split}}.log",
        wildcard_constraints:
            split=SIGNAL_SPLITS,
        cache: True
        conda:
            ENV
        threads: 1
        resources:
            mem_mb=4000,
            runtime=30,
        params:
            cfg=lambda wc, s=_signal: signal_params(wc, s),
            code=code("kdpipe.stages.signal_gather", *PLAN.signal_modules(_signal)),
        shell:
            "python -m kdpipe signal-gather --params {params.cfg:q} --code {params.code} --parts {input.parts} --out $(dirname {output.json:q})"
            " > {log} 2>&1"


rule prototypes:
    """Meta-KD's prototype scores of the train rows, from the un-fine-tuned backbone's token-mean embeddings."""
    input:
        data=DATA_DIR,
    output:
        scores=PROTOTYPES,
        manifest=PROTOTYPES.replace(".parquet", ".json"),
    log:
        f"{LOGS}/prototypes.log",
    cache: True
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    params:
        cfg=as_json(PLAN.prototype_params()),
        code=code("kdpipe.stages.prototypes"),
    shell:
        "python -m kdpipe --threads {threads} prototypes --params {params.cfg:q} --code {params.code} --data {input.data} --out {output.scores}"
        " > {log} 2>&1"
