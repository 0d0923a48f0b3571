# Teacher signals on one split (kdpipe/signals/catalog.py names each signal's files and pass). Each pass runs as S
# shard jobs (one generic rule) and one gather job per signal, named after the signal: S = mc_dropout.shards or
# dump.shards in the config, or `--set-scatter mc_dropout=S dump=S`. The gathered artifacts are byte-identical for
# any S (tested), so S is in no job's config slice; the parts are temp files. Method-specific prototypes close
# the file (Meta-KD).


scattergather:
    mc_dropout=PLAN.shards("mc_dropout"),
    dump=PLAN.shards("dump"),


PART = f"{SIGNALS}/shards/{{signal}}.{{scatteritem}}"  # one shard's part folder (a temp output)


def signal_params(wildcards, signal=None):
    """The config slice of one signal of one teacher on one split."""
    return as_json(
        PLAN.signal_params(wildcards.teacher, wildcards.split, signal or wildcards.signal)
    )


def signal_code(wildcards, stage, signal=None):
    """The fingerprint of a signal stage and the pass it imports by name."""
    return code(stage, *PLAN.signal_modules(signal or wildcards.signal))


def signal_outputs(signal):
    """The files of a signal, as the catalog names them, each named by its extension (npy, parquet, json)."""
    return {Path(file).suffix[1:]: file for file in signal_files(signal, SIGNALS)}


def gather_parts(wildcards, signal):
    """The part folders of every shard of a signal's pass (as many as its config section's shards)."""
    part = PART.format(signal=signal, teacher=wildcards.teacher, split=wildcards.split, scatteritem="{scatteritem}")
    return getattr(gather, signal_spec(signal).shards)(part)


rule signal_shard:
    """One shard of a teacher signal pass (logits, MC-dropout, a feature dump, Meta-KD's domain signals)."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        part=temp(directory(PART)),
    wildcard_constraints:
        signal=one_of(SIGNAL_NAMES),
    params:
        cfg=signal_params,
        code=lambda wc: signal_code(wc, "kdpipe.stages.signal_shard"),
    log:
        f"{LOGS}/{{signal}}/{{teacher}}.{{split}}.{{scatteritem}}.log",
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} signal-shard --params {params.cfg:q} --teacher {input.teacher}"
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
        params:
            cfg=lambda wc, s=_signal: signal_params(wc, s),
            code=lambda wc, s=_signal: signal_code(wc, "kdpipe.stages.signal_gather", s),
        log:
            f"{LOGS}/{_signal}/{{teacher}}.{{split}}.log",
        cache: True
        threads: 1
        resources:
            mem_mb=4000,
            runtime=30,
        conda:
            ENV
        shell:
            "{KDPIPE} signal-gather --params {params.cfg:q} --parts {input.parts} --out $(dirname {output.json:q})"
            " > {log} 2>&1"


rule prototypes:
    """Meta-KD's prototype scores of the train rows, from the un-fine-tuned backbone's token-mean embeddings."""
    input:
        data=DATA_DIR,
    output:
        scores=PROTOTYPES,
        manifest=PROTOTYPES.replace(".parquet", ".json"),
    params:
        cfg=as_json(PLAN.prototype_params()),
        code=code("kdpipe.stages.prototypes"),
    log:
        f"{LOGS}/prototypes.log",
    cache: True
    threads: 2
    resources:
        mem_mb=6000,
        runtime=120,
        gpu=1,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} prototypes --params {params.cfg:q} --data {input.data} --out {output.scores}"
        " > {log} 2>&1"
