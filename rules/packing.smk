# Packed micro-batches (workload.packing, docs/packing.md; issue 53): after the run's decisions, the packed block
# sessions at each capacity T (search.packed: no overlap, the written set, the best NVIDIA preset on te, beside a
# few native micro-batches, in alternating rounds, one session per T), then packing.json and each framework's
# settings at the chosen T (cli.packing). Which TP and which T are decided after decisions.json (checkpoint
# packing_plan); a run without workload.packing has none of these jobs.
wildcard_constraints:
    capacity=r"\d+",


checkpoint packing_plan:
    output:
        str(R.packing_plan_json),
    input:
        decisions=str(R.decisions_json),
        layer=layer_files,
    params:
        cfg=CONFIG_JSON,
        settings=json.dumps({"packing": config.get("workload", {}).get("packing"), "backend": S.backend,
                             "tps": S.tp_sizes, "presets": S.search.te_presets}, sort_keys=True, default=str),
    log:
        str(R.log("packing_plan")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune packing-plan --config {params.cfg} --out {output} > {log} 2>&1"


rule measure_packed:
    output:
        str(R.packed_session("{tp}", "{capacity}") / SESSION_JSON),
    input:
        unpack(calibration_input),
        layer=str(R.layer_json("{tp}")),
        model=MODEL_JSON,
    params:
        cfg=CONFIG_JSON,
        measurement=packed_measurement,
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        str(R.log("measure", "layer-tp{tp}-pack{capacity}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune measure-packed --config {params.cfg} --tp {wildcards.tp} --capacity {wildcards.capacity}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


rule packing_decide:
    output:
        str(R.packing_json),
    input:
        plan=str(R.packing_plan_json),
        sessions=packed_sessions,
        decisions=str(R.decisions_json),
    params:
        cfg=CONFIG_JSON,
        config=RESOLVED_CONFIG,
    log:
        str(R.log("packing_decide")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune packing-decide --config {params.cfg} > {log} 2>&1"
