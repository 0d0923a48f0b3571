# N trivial jobs for benchmarks/slurm_overhead.py: a chain (each job needs the previous one, so the jobs run one after
# another and the time per job is one job's whole latency) or a fan (N independent jobs at once).
N = int(config.get("count", 4))
SHAPE = config.get("shape", "chain")


rule all:
    input:
        f"chain/{N - 1}.txt" if SHAPE == "chain" else expand("fan/{i}.txt", i=range(N)),


rule chain:
    input:
        lambda wc: [f"chain/{int(wc.i) - 1}.txt"] if int(wc.i) > 0 else [],
    output:
        "chain/{i}.txt",
    threads: 1
    resources:
        mem_mb=100,
        runtime=5,
    shell:
        "echo {wildcards.i} > {output}"


rule fan:
    output:
        "fan/{i}.txt",
    threads: 1
    resources:
        mem_mb=100,
        runtime=5,
    shell:
        "echo {wildcards.i} > {output}"
