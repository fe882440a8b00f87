# timing.window_ms: auto. One GPU measures the node's round-to-round noise at several timed windows
# (a null pair per op, tptune.cli.calibrate) and chooses the window every measuring job then
# uses; the jobs read it from calibration/window.json beside the run's config.json. On CPU nothing is
# measured (a round there has no window) and the run goes on.
rule calibrate_window:
    output:
        CALIBRATION,
    input:
    params:
        cfg=CONFIG_JSON,
        settings=lambda wc: json.dumps({"backend": S.backend, "device": S.device, "ops": S.ops, "tp": S.tp_sizes[0],
                                        "timing": S.timing.as_dict(),
                                        "noise_floor": S.decision.noise_floor},
                                       sort_keys=True),
    resources:
        gpus=1,
    log:
        str(R.log("calibrate_window")),
    conda:
        "../envs/tptune.yaml"
    shell:
        "tptune calibrate-window --run-config {params.cfg} > {log} 2>&1"
