# Trace metrics of every setting of a session (CPU; after the GPU job that measured the session).
rule analyze_step:
    output:
        str(R.step_analysis("{op}", "{tp}", "{dim}", "{step}")),
    input:
        str(R.search_step("{op}", "{tp}", "{dim}", "{step}")),
    params:
        session=lambda wc: str(R.step_session(wc.op, wc.tp, wc.dim, wc.step)),
    log:
        str(R.log("analyze", "{op}-tp{tp}-{dim}-step{step}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-session --session {params.session} --out {output} > {log} 2>&1"


rule analyze_point:
    output:
        str(R.point_analysis("{op}", "{tp}")),
    input:
        str(R.tp_point("{op}", "{tp}")),
    params:
        session=lambda wc: str(R.point_session(wc.op, wc.tp)),
    log:
        str(R.log("analyze", "{op}-tp{tp}-point")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune analyze-session --session {params.session} --out {output} > {log} 2>&1"
