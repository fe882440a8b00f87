# The run's resolved config, config.json. Parsing happens in every dry run and before Snakemake takes
# its lock, so nothing is written then: an invocation that goes on to run jobs writes it in onstart
# (after Snakemake's lock, never in a dry run, before any job) when it is new or a setting changed,
# holding the run's lock (workflow.start_run) for as long as it runs, so an invocation beside it is
# refused before it changes anything. No job takes config.json as an input (a job upstream of all
# would hide every other job's params from Snakemake's rerun check): what reruns is decided by each
# job's params (rules/common.smk), and a measuring job refuses a config.json that gives its session
# other measurement settings than the workflow scheduled it with.
onstart:
    try:
        run_lock.start_run(R, RESOLVED_CONFIG)
    except TptuneError as exc:
        raise WorkflowError(str(exc)) from None
    progress.record_start(R, sessions=scheduled_sessions())   # the progress line counts from here
    if not R.wall_predicted_json.exists():    # a fresh run: the time-left estimate has the prediction from its first line
        from tptune.cli.wall import write_plan_estimate

        write_plan_estimate(S, R)


rule collect:
    output:
        parquet=str(R.measurements_parquet),
        csv=str(R.measurements_csv),
    input:
        records=all_session_records,
        analysis=all_session_analysis,
    params:
        sessions=all_session_jsons,
    log:
        str(R.log("collect")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune collect --sessions {params.sessions} --out {output.parquet} > {log} 2>&1"


# The layer stage: per TP, the block session (GPU), and the run's tuned preset it measures.
rule layer:
    output:
        str(R.layer_json("{tp}")),
    input:
        unpack(calibration_input),
        points=layer_inputs,
        model=MODEL_JSON,
    params:
        cfg=CONFIG_JSON,
        measurement=layer_measurement,
    resources:
        gpus=lambda wc: int(wc.tp),
    threads: lambda wc: int(wc.tp) if S.device == "cpu" else 1
    log:
        str(R.log("layer", "tp{tp}")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune layer --config {params.cfg} --tp {wildcards.tp} --out {output}"
        " --expect {params.measurement[digest]} > {log} 2>&1"


# decisions.json names the files it wrote (meta.files: one set per TP, and the model TP's under the plain
# names only when there is one), so they are not outputs Snakemake could expect in every run.
rule decide:
    output:
        str(R.decisions_json),
    input:
        decisions=[str(R.op_final(op)) for op in S.ops],
        measurements=str(R.measurements_parquet),
        layer=layer_files,
    params:
        cfg=CONFIG_JSON,
        config=RESOLVED_CONFIG,
    log:
        str(R.log("decide")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune decide --config {params.cfg} --decisions {input.decisions} > {log} 2>&1"


# The confirm stage (docs/confirm.md), opt-in (confirm.enabled): the model TP's set, the best NVIDIA preset and
# no overlap in Megatron-LM's own training loop, on the node's GPUs; the report reads its confirm.json
# (rules/common.smk confirm_files).
rule confirm:
    output:
        str(R.confirm_json),
    input:
        decisions=str(R.decisions_json),
        model=MODEL_JSON,
        packing=packing_files,     # with workload.packing the loop trains packed data at its decided capacity
    params:
        run_dir=lambda wc, output: os.path.dirname(output[0]),
        c=S.confirm,
        packed=" --packed" if packing_files() else "",
        checkout=(f" --megatron-lm {shlex.quote(S.confirm.megatron_lm)}" if S.confirm.megatron_lm else ""),
    resources:
        gpus=max(S.tp_sizes),
    log:
        str(R.log("confirm")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune confirm {params.run_dir} --rounds {params.c.rounds} --max-layers {params.c.max_layers}"
        " --iters {params.c.iters} --micro-batches {params.c.micro_batches} --timeout {params.c.timeout_s}"
        " --max-rounds {params.c.max_rounds} --budget {params.c.budget_s} --target {params.c.target_half_width}"
        "{params.checkout}{params.packed} --exit-zero > {log} 2>&1"


rule report:
    output:
        str(R.report_md),
    input:
        plan=str(R.plan_parquet),
        measurements=str(R.measurements_parquet),
        decisions=str(R.decisions_json),
        confirm=confirm_files,
        packing=packing_files,
    params:
        cfg=CONFIG_JSON,
        config=RESOLVED_CONFIG,
    log:
        str(R.log("report")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune report --config {params.cfg} --out {output} > {log} 2>&1"


# The run's last job: it fails (and the run ends non-zero) when a stage had no successful member; the
# report, written before it, says which at its top. Re-runs once the failed sessions are re-measured.
rule check_run:
    output:
        str(R.status_json),
    input:
        str(R.report_md),
    params:
        run_dir=lambda wc, output: os.path.dirname(output[0]),
    log:
        str(R.log("check_run")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune check-run {params.run_dir} --out {output} > {log} 2>&1"
