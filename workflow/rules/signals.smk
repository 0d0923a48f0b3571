# Teacher signals on one split, each pass run as S shards (kdpipe/shards.py) and gathered into the artifact:
# S = mc_dropout.shards / dump.shards in the config, or `--set-scatter mc=4 dump=4`. The gathered artifacts are
# byte-identical for any S (tested), so S is not part of any job's config slice; the parts are temp files.
scattergather:
    mc=PLAN.shards("mc_dropout"),
    dump=PLAN.shards("dump"),


PART = f"{SIGNALS}/shards/{{pass_name}}.{{scatteritem}}"   # one shard's part folder (a temp output)


def parts(pass_name, scatter):
    """The part folders of every shard of one pass; {teacher} and {split} (and a {feature} pass name) stay
    wildcards of the gather rule."""
    pattern = PART.replace("{pass_name}", pass_name)
    for wildcard in ("{teacher}", "{split}", "{feature}"):
        pattern = pattern.replace(wildcard, "{" + wildcard + "}")
    return scatter(pattern)


FEATURES = "hidden|attentions_mean|attentions"     # kdpipe.dump.FEATURES
SHARD_RESOURCES = dict(mem_mb=6000, runtime=120, gpu=1)


rule mc_dropout_shard:
    """One shard of the offline MC-dropout pass (T dropout-on passes as one enlarged batch)."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        part=temp(directory(PART.replace("{pass_name}", "mc"))),
    params:
        cfg=lambda wc: as_json(PLAN.mc_params(wc.split)),
        code=code("kdpipe.mc_dropout"),
    log:
        f"{LOGS}/mc_dropout/{{teacher}}.{{split}}.{{scatteritem}}.log",
    threads: 2
    resources:
        **SHARD_RESOURCES,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} mc-dropout-shard --params {params.cfg:q} --teacher {input.teacher}"
        " --data {input.data} --shard {wildcards.scatteritem} --out-part {output.part} > {log} 2>&1"


rule mc_dropout:
    """MC-dropout mean probabilities and scores of one teacher on one split, gathered from its shards."""
    input:
        parts=parts("mc", gather.mc),
    output:
        mean=f"{SIGNALS}/mc.npy",
        scores=f"{SIGNALS}/mc.parquet",
        manifest=f"{SIGNALS}/mc.json",
    params:
        cfg=lambda wc: as_json(PLAN.mc_params(wc.split)),
        code=code("kdpipe.mc_dropout"),
    log:
        f"{LOGS}/mc_dropout/{{teacher}}.{{split}}.log",
    cache: True
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        ENV
    shell:
        "{KDPIPE} gather-mc --params {params.cfg:q} --parts {input.parts} --out-npy {output.mean}"
        " --out-parquet {output.scores} > {log} 2>&1"


rule dump_teacher_shard:
    """One shard of the eval-mode teacher logits pass."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        part=temp(directory(PART.replace("{pass_name}", "logits"))),
    params:
        cfg=lambda wc: as_json(PLAN.dump_params(wc.split)),
        code=code("kdpipe.dump"),
    log:
        f"{LOGS}/dump_teacher/{{teacher}}.{{split}}.{{scatteritem}}.log",
    threads: 2
    resources:
        **SHARD_RESOURCES,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} dump-teacher-shard --params {params.cfg:q} --teacher {input.teacher}"
        " --data {input.data} --shard {wildcards.scatteritem} --out-part {output.part} > {log} 2>&1"


rule dump_teacher:
    """Eval-mode teacher logits on one split, for distillation from the cache, gathered from its shards."""
    input:
        parts=parts("logits", gather.dump),
    output:
        logits=f"{SIGNALS}/logits.parquet",
        manifest=f"{SIGNALS}/logits.json",
    params:
        cfg=lambda wc: as_json(PLAN.dump_params(wc.split)),
        code=code("kdpipe.dump"),
    log:
        f"{LOGS}/dump_teacher/{{teacher}}.{{split}}.log",
    cache: True
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        ENV
    shell:
        "{KDPIPE} gather-logits --params {params.cfg:q} --parts {input.parts} --out-logits {output.logits} > {log} 2>&1"


rule dump_feature_shard:
    """One shard of a teacher feature dump: hidden states or attentions (all heads, or their mean), only the layers
    the students' methods align with."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        part=temp(directory(PART.replace("{pass_name}", "{feature}"))),
    wildcard_constraints:
        feature=FEATURES,
    params:
        cfg=lambda wc: as_json(PLAN.feature_params(wc.teacher, wc.split, wc.feature)),
        code=code("kdpipe.dump"),
    log:
        f"{LOGS}/dump_{{feature}}/{{teacher}}.{{split}}.{{scatteritem}}.log",
    threads: 2
    resources:
        **SHARD_RESOURCES,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} dump-feature-shard --params {params.cfg:q} --teacher {input.teacher}"
        " --data {input.data} --shard {wildcards.scatteritem} --out-part {output.part} > {log} 2>&1"


rule dump_feature:
    """A teacher feature dump (float16 npy, memory flat in N, refused up front when the disk lacks room), gathered
    from its shards."""
    input:
        parts=parts("{feature}", gather.dump),
    output:
        array=f"{SIGNALS}/{{feature}}.npy",
        manifest=f"{SIGNALS}/{{feature}}.json",
    wildcard_constraints:
        feature=FEATURES,
    params:
        cfg=lambda wc: as_json(PLAN.feature_params(wc.teacher, wc.split, wc.feature)),
        code=code("kdpipe.dump"),
    log:
        f"{LOGS}/dump_{{feature}}/{{teacher}}.{{split}}.log",
    cache: True
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        ENV
    shell:
        "{KDPIPE} gather-feature --params {params.cfg:q} --parts {input.parts} --out-npy {output.array} > {log} 2>&1"


rule dump_domain_shard:
    """One shard of a meta-teacher's Meta-KD signals: domain representations and domain-expertise weights."""
    input:
        teacher=TEACHER,
        data=DATA_DIR,
    output:
        part=temp(directory(PART.replace("{pass_name}", "domain"))),
    params:
        cfg=lambda wc: as_json(PLAN.domain_params(wc.split)),
        code=code("kdpipe.domain_dump"),
    log:
        f"{LOGS}/dump_domain/{{teacher}}.{{split}}.{{scatteritem}}.log",
    threads: 2
    resources:
        **SHARD_RESOURCES,
    conda:
        ENV
    shell:
        "{KDPIPE} --threads {threads} dump-domain-shard --params {params.cfg:q} --teacher {input.teacher}"
        " --data {input.data} --shard {wildcards.scatteritem} --out-part {output.part} > {log} 2>&1"


rule dump_domain:
    """A meta-teacher's domain representations (float16 npy) and expertise weights (Parquet), gathered."""
    input:
        parts=parts("domain", gather.dump),
    output:
        array=f"{SIGNALS}/domain.npy",
        table=f"{SIGNALS}/domain.parquet",
        manifest=f"{SIGNALS}/domain.json",
    params:
        cfg=lambda wc: as_json(PLAN.domain_params(wc.split)),
        code=code("kdpipe.domain_dump"),
    log:
        f"{LOGS}/dump_domain/{{teacher}}.{{split}}.log",
    cache: True
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        ENV
    shell:
        "{KDPIPE} gather-domain --params {params.cfg:q} --parts {input.parts} --out-npy {output.array} > {log} 2>&1"


rule prototypes:
    """Meta-KD's prototype scores of the train rows, from the un-fine-tuned backbone's token-mean embeddings."""
    input:
        data=DATA_DIR,
    output:
        scores=PROTOTYPES,
        manifest=PROTOTYPES.replace(".parquet", ".json"),
    params:
        cfg=as_json(PLAN.prototype_params()),
        code=code("kdpipe.prototypes"),
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
