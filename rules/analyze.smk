# Trace metrics of every setting of a session (CPU; after the GPU job that measured the session).
rule analyze_step:
    output:
        f"{RUN_DIR}/analysis/{{op}}/tp{{tp}}/{{dim}}/step{{step}}.parquet",
    input:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/{{dim}}/step{{step}}.json",
    log:
        f"{RUN_DIR}/logs/analyze/{{op}}-tp{{tp}}-{{dim}}-step{{step}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-session --session {RUN_DIR}/sessions/{wildcards.op}/tp{wildcards.tp}/{wildcards.dim}/step{wildcards.step}"
        " --out {output} > {log} 2>&1"


rule analyze_point:
    output:
        f"{RUN_DIR}/analysis/{{op}}/tp{{tp}}/point.parquet",
    input:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/point.json",
    log:
        f"{RUN_DIR}/logs/analyze/{{op}}-tp{{tp}}-point.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-session --session {RUN_DIR}/sessions/{wildcards.op}/tp{wildcards.tp}/point"
        " --out {output} > {log} 2>&1"
