# One job per case. GPU ids come from tptune's lock-based pool; resources keep Snakemake from
# starting more GPUs' worth of jobs than --resources gpus=N allows.
rule profile:
    output:
        f"{RUN_DIR}/cases/{{op}}/tp{{tp}}/{{variant}}/run.json",
    input:
        cfg=ancient(CONFIG_JSON),
        model=f"{RUN_DIR}/model.json",
    params:
        settings=op_params,
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        f"{RUN_DIR}/logs/profile/{{op}}-tp{{tp}}-{{variant}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune profile --config {input.cfg} --case {wildcards.op}-tp{wildcards.tp}-{wildcards.variant}"
        " --out {output} > {log} 2>&1"


rule analyze_case:
    output:
        f"{RUN_DIR}/analysis/{{op}}/tp{{tp}}/{{variant}}.parquet",
    input:
        f"{RUN_DIR}/cases/{{op}}/tp{{tp}}/{{variant}}/run.json",
    log:
        f"{RUN_DIR}/logs/analyze/{{op}}-tp{{tp}}-{{variant}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-case --run-json {input} --out {output} > {log} 2>&1"
