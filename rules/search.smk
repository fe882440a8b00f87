# Data-dependent searches. Each step of each binary search (one op, TP and dimension) is a GPU job
# that measures the points the step compares side by side, in one session (alternating rounds on one
# warm worker group), then a checkpoint that decides what the next step measures. The TP point of each
# (op, TP) is one such session too: references, bound, the searches' winners and the tuned
# combinations. The TP decision of each op is a chain of checkpoints: TP*2 only when TP passed.
# Measuring and deciding are separate jobs so that, under Slurm, the GPU jobs can be grouped into
# submissions and the bookkeeping runs on the submitting host (a group may hold no checkpoint).
rule measure_step:
    output:
        str(R.step_session("{op}", "{tp}", "{dim}", "{step}") / SESSION_JSON),
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
        str(R.log("measure", "{op}-tp{tp}-{dim}-step{step}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune measure-step --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --dim {wildcards.dim} --step {wildcards.step} {params.prev}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


checkpoint search_step:
    output:
        str(R.search_step("{op}", "{tp}", "{dim}", "{step}")),
    input:
        unpack(search_step_inputs),
    params:
        cfg=CONFIG_JSON,
        settings=step_derive_params,
        prev=lambda wc, input: f"--prev {input.prev}" if "prev" in input.keys() else "",
    log:
        str(R.log("search", "{op}-tp{tp}-{dim}-step{step}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune search-step --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --dim {wildcards.dim} --step {wildcards.step} {params.prev} --out {output} > {log} 2>&1"


rule search_result:
    output:
        str(R.search_result("{op}", "{tp}", "{dim}")),
    input:
        search_result_input,
    log:
        str(R.log("search_result", "{op}-tp{tp}-{dim}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "cp {input} {output} 2> {log}"


checkpoint tp_results:
    output:
        str(R.tp_results("{op}", "{tp}")),
    input:
        results=tp_results_inputs,
    log:
        str(R.log("tp_results", "{op}-tp{tp}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune join-json --out {output} {input.results} > {log} 2>&1"


rule measure_point:
    output:
        str(R.point_session("{op}", "{tp}") / SESSION_JSON),
    input:
        unpack(tp_point_inputs),
    params:
        cfg=CONFIG_JSON,
        measurement=point_measurement,
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        str(R.log("measure", "{op}-tp{tp}-point")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune measure-point --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


rule tp_point:
    output:
        str(R.tp_point("{op}", "{tp}")),
    input:
        session=str(R.point_session("{op}", "{tp}") / SESSION_JSON),
    params:
        cfg=CONFIG_JSON,
        settings=point_derive_params,
    log:
        str(R.log("search", "{op}-tp{tp}-point")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune tp-point --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --out {output} > {log} 2>&1"


checkpoint tp_step:
    output:
        str(R.tp_decision("{op}", "{tp}")),
    input:
        unpack(tp_step_inputs),
    params:
        cfg=CONFIG_JSON,
        settings=tp_derive_params,
    log:
        str(R.log("search", "{op}-tp{tp}-decision")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune tp-step --config {params.cfg} --op {wildcards.op} --tp {wildcards.tp}"
        " --points {input.points} --out {output} > {log} 2>&1"


rule op_final:
    output:
        str(R.op_final("{op}")),
    input:
        op_final_input,
    log:
        str(R.log("op_final", "{op}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "cp {input} {output} 2> {log}"


checkpoint searches_done:
    output:
        str(R.searches_done),
    input:
        [str(R.op_final(op)) for op in S.ops],
    log:
        str(R.log("searches_done")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune join-json --out {output} {input} > {log} 2>&1"
