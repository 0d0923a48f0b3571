# Teacher signals on one split (kdpipe/signals/catalog.py names each signal's files and pass). Each pass runs as S
# shard jobs (one generic rule) and one gather job per signal, named after the signal: S = mc_dropout.shards or
# dump.shards in the config, or `--set-scatter mc_dropout=S dump=S`. The gathered artifacts are byte-identical for
# any S (tested), so S is in no job's config slice; the parts are temp files. Meta-KD's prototype scores close
# the file. The helpers (signal_params, gather_parts...) are in common.smk.


rule signal_shard:
    """One shard of a teacher signal pass (logits, MC-dropout, a feature dump, Meta-KD's domain signals)."""
    input:
        teacher=TEACHER,
        data=lambda wc: PLAN.split_data(wc.split),
    output:
        part=temp(directory(PART)),
    log:
        f"{LOGS}/{{signal}}/{{teacher}}.{{split}}.{{scatteritem}}.log",
    wildcard_constraints:
        signal=one_of(SIGNAL_NAMES),
        split=SIGNAL_SPLITS,
    conda:
        ENV
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    params:
        cfg=signal_params,
        code=lambda wc: signal_code(wc, "kdpipe.stages.signal_shard"),
    shell:
        "python -m kdpipe --threads {threads} signal-shard --params {params.cfg:q} --teacher {input.teacher}"
        " --data {input.data} --shard {wildcards.scatteritem} --out-part {output.part} > {log} 2>&1"


for _signal in SIGNAL_NAMES:

    rule:
        # A signal gathered from the parts of its shards into the files the catalog names (one rule per signal,
        # named after it: logits, mc, hidden, attentions, attentions_mean, domain).
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
            code=lambda wc, s=_signal: signal_code(wc, "kdpipe.stages.signal_gather", s),
        shell:
            "python -m kdpipe signal-gather --params {params.cfg:q} --parts {input.parts} --out $(dirname {output.json:q})"
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
        "python -m kdpipe --threads {threads} prototypes --params {params.cfg:q} --data {input.data} --out {output.scores}"
        " > {log} 2>&1"
