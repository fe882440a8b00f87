# Data-dependent searches. Each step of each binary search (one op, TP and dimension) is a GPU job
# that measures the points the step compares side by side, in one session (alternating rounds on one
# warm worker group), then a checkpoint that decides what the next step measures. The TP point of each
# (op, TP) is one such session too: references, bound, the searches' winners and the tuned
# combinations. The TP decision of each op is a chain of checkpoints: TP*2 only when TP passed.
# Measuring and deciding are separate jobs so that, under Slurm, the GPU jobs can be grouped into
# submissions and the bookkeeping runs on the submitting host (a group may hold no checkpoint).
rule measure_step:
    output:
        f"{RUN_DIR}/sessions/{{op}}/tp{{tp}}/{{dim}}/step{{step}}/session.json",
    input:
        unpack(measure_step_inputs),
    params:
        cfg=CONFIG_JSON,
        measurement=step_measurement,
        prev=lambda wc, input: f"--prev {input.prev}" if "prev" in input.keys() else "",
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        f"{RUN_DIR}/logs/measure/{{op}}-tp{{tp}}-{{dim}}-step{{step}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune measure-step --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --dim {wildcards.dim} --step {wildcards.step} {params.prev}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


checkpoint search_step:
    output:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/{{dim}}/step{{step}}.json",
    input:
        unpack(search_step_inputs),
    params:
        cfg=CONFIG_JSON,
        settings=step_derive_params,
        prev=lambda wc, input: f"--prev {input.prev}" if "prev" in input.keys() else "",
    log:
        f"{RUN_DIR}/logs/search/{{op}}-tp{{tp}}-{{dim}}-step{{step}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune search-step --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --dim {wildcards.dim} --step {wildcards.step} {params.prev} --out {output} > {log} 2>&1"


rule search_result:
    output:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/{{dim}}/result.json",
    input:
        search_result_input,
    log:
        f"{RUN_DIR}/logs/search_result/{{op}}-tp{{tp}}-{{dim}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "cp {input} {output} 2> {log}"


checkpoint tp_results:
    output:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/results.json",
    input:
        results=tp_results_inputs,
    log:
        f"{RUN_DIR}/logs/tp_results/{{op}}-tp{{tp}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune join-json --out {output} {input.results} > {log} 2>&1"


rule measure_point:
    output:
        f"{RUN_DIR}/sessions/{{op}}/tp{{tp}}/point/session.json",
    input:
        unpack(tp_point_inputs),
    params:
        cfg=CONFIG_JSON,
        measurement=point_measurement,
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        f"{RUN_DIR}/logs/measure/{{op}}-tp{{tp}}-point.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune measure-point --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


rule tp_point:
    output:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/point.json",
    input:
        session=f"{RUN_DIR}/sessions/{{op}}/tp{{tp}}/point/session.json",
    params:
        cfg=CONFIG_JSON,
        settings=point_derive_params,
    log:
        f"{RUN_DIR}/logs/search/{{op}}-tp{{tp}}-point.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune tp-point --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --out {output} > {log} 2>&1"


checkpoint tp_step:
    output:
        f"{RUN_DIR}/search/{{op}}/tp{{tp}}/decision.json",
    input:
        unpack(tp_step_inputs),
    params:
        cfg=CONFIG_JSON,
        settings=tp_derive_params,
    log:
        f"{RUN_DIR}/logs/search/{{op}}-tp{{tp}}-decision.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune tp-step --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --points {input.points} --out {output} > {log} 2>&1"


rule op_final:
    output:
        f"{RUN_DIR}/search/{{op}}/final.json",
    input:
        op_final_input,
    log:
        f"{RUN_DIR}/logs/op_final/{{op}}.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "cp {input} {output} 2> {log}"


checkpoint searches_done:
    output:
        f"{RUN_DIR}/search/done.json",
    input:
        [f"{RUN_DIR}/search/{op}/final.json" for op in S.ops],
    log:
        f"{RUN_DIR}/logs/searches_done.log",
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune join-json --out {output} {input} > {log} 2>&1"
