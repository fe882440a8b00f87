# Trace metrics of every setting of a session (CPU; after the GPU job that measured the session).
rule analyze_step:
    output:
        f"{RUN_DIR}/analysis/{{op}}/tp{{tp}}/{{dim}}/step{{step}}.parquet",
    input:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/{{dim}}/step{{step}}.json",
    params:
        session=lambda wc: f"{RUN_DIR}/sessions/{wc.op}/tp{wc.tp}/{wc.dim}/step{wc.step}",
    log:
        f"{RUN_DIR}/logs/analyze/{{op}}-tp{{tp}}-{{dim}}-step{{step}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-session --session {params.session} --out {output} > {log} 2>&1"


rule analyze_point:
    output:
        f"{RUN_DIR}/analysis/{{op}}/tp{{tp}}/point.parquet",
    input:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/point.json",
    params:
        session=lambda wc: f"{RUN_DIR}/sessions/{wc.op}/tp{wc.tp}/point",
    log:
        f"{RUN_DIR}/logs/analyze/{{op}}-tp{{tp}}-point.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-session --session {params.session} --out {output} > {log} 2>&1"
