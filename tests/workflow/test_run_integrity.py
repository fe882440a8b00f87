"""Run integrity on CPU, for real (Snakemake, gloo workers): a run's files state the settings its
sessions were measured with, only what changes a measurement re-measures, failures are loud and the
recovery command re-measures (docs/run-integrity.md). One run is shared: it starts with the whole layer
stage failing (the run's fault injection), is recovered with the documented command, and the tests
after that use the recovered run. The tests run in file order."""
import copy
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import yaml

from conftest import base_config, copy_workflow

pytestmark = pytest.mark.slow
RUN = "outputs/integrity"
# every block setting of the torch layer stage fails; fc2's chunked.n4 loses a rank in every attempt
# (retried once, then failed)
FAULTS = {**{f"layer-tp2-{v}": "raise:0" for v in ("none", "nocomm", "chunked.n2", "chunked.n4")},
          "fc2-tp2-chunked.n4": "exit:1"}
MEASURING = ("measure_step", "measure_point", "layer")


def smk(workdir, *args, configs=("run.yaml",), timeout=900):
    return subprocess.run([sys.executable, "-m", "snakemake", *args, "--cores", "2", "--configfile", *configs],
                          cwd=workdir, capture_output=True, text=True, timeout=timeout)


def cfg_dict(workdir, **over):
    cfg = base_config(workdir / "pool", **{"run": "integrity", "ops": ["qkv", "fc2"], "tp_sizes": [2],
                                           "search": {"chunks": [2, 4]}, **over})
    cfg["model"] = "config/models/tiny.yaml"
    return cfg


def write(workdir, name, cfg):
    (workdir / name).write_text(yaml.safe_dump(cfg))


def planned(text: str) -> dict:
    """{rule: count} of a dry run's jobs."""
    import re
    out = {}
    for r in re.findall(r"^(?:rule|checkpoint|localrule|localcheckpoint) (\w+):$", text, re.M):
        out[r] = out.get(r, 0) + 1
    return out


def started(workdir, rel):
    return json.loads((workdir / RUN / "sessions" / rel / "session.json").read_text())["started"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("integrity")
    copy_workflow(workdir)
    (workdir / "pool").mkdir()
    write(workdir, "run.yaml", cfg_dict(workdir, faults=FAULTS))
    dry = smk(workdir, "-n")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert not (workdir / "outputs").exists(), "a dry run wrote into outputs/"
    first = smk(workdir)
    return {"dir": workdir, "first": first}


def test_dry_run_writes_nothing_and_all_failed_stage_ends_the_run_non_zero(run):
    """Before: config.json was written at parse time (a dry run created outputs/), and a layer stage
    whose every member failed ended the run 0 with "Failures: None." and failed-against-failed "ties"."""
    w, first = run["dir"], run["first"]
    assert first.returncode != 0
    assert "layer stage at TP=2 failed: none of its" in first.stdout + first.stderr
    report = (w / RUN / "report.md").read_text()
    head = report.split("## ", 1)[0]
    assert "**Run failed — layer stage at TP=2: none of its 3 settings was measured**" in head
    fails = report.split("## Failures", 1)[1].split("## ", 1)[0]
    layer = json.loads((w / RUN / "layer/tp2.json").read_text())
    for row in layer["settings"]:
        assert f"`layer/tp2` `{row['case']}`: **failed**" in fails
        if "tuned_vs" in row:
            assert row["tuned_vs"]["failed"] == "both"       # never a tie
    assert "`fc2/tp2/chunks/step0` `fc2-tp2-chunked.n4`: **failed** — rank_died" in fails
    assert "`fc2-tp2-chunked.n4`: attempt 1 failed and was **retried**" in fails
    assert "tie" not in report.split("## Layer at TP=2", 1)[1].split("## ", 1)[0]
    assert not (w / RUN / "status.json").exists()
    # every session recorded what it was measured with
    sess = json.loads((w / RUN / "sessions/qkv/tp2/point/session.json").read_text())
    assert sess["settings"]["timing"]["iters"] == 3 and "qkv-tp2-none" in sess["settings"]["members"]


def test_failed_prints_measuring_outputs_and_refuses_a_non_run(run):
    """Before: IndexError for the layer stage; nothing, exit 0, for a folder that is not a run."""
    w = run["dir"]
    p = subprocess.run([sys.executable, "-m", "tptune", "failed", RUN], cwd=w, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [f"{RUN}/sessions/fc2/tp2/chunks/step0/session.json", f"{RUN}/layer/tp2.json"]
    for bad, needle in (("outputs/nope", "no such folder"), ("config", "not a run folder")):
        p = subprocess.run([sys.executable, "-m", "tptune", "failed", bad], cwd=w, capture_output=True, text=True)
        assert p.returncode == 2 and needle in p.stderr and not p.stdout


def test_recovery_command_re_measures_the_failed_sessions(run):
    """The documented recovery, verbatim: the cause gone (the faults removed, which re-measures
    nothing by itself), snakemake -R $(tptune failed outputs/<run>) re-measures exactly the failed
    sessions. Before: -R on the printed checkpoint file re-derived without re-measuring, exit 0."""
    w = run["dir"]
    write(w, "run.yaml", cfg_dict(w))
    dry = smk(w, "-n")
    assert not set(planned(dry.stdout)) & set(MEASURING), planned(dry.stdout)
    before = {rel: started(w, rel) for rel in ("qkv/tp2/chunks/step0", "qkv/tp2/point", "fc2/tp2/chunks/step0",
                                               "layer/tp2")}
    t0 = time.time()
    p = subprocess.run(["bash", "-c", f"snakemake --cores 2 --configfile run.yaml -R $(tptune failed {RUN})"],
                       cwd=w, capture_output=True, text=True, timeout=900,
                       env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # the progress lines count this invocation's sessions from its own start, not the first run's
    import re
    lines = re.findall(r"^tptune: session (\d+)/(\d+) done \((.+?), [\d.]+ s\) · (?:(\d+) min )?([\d.]+) s elapsed",
                       p.stderr, re.M)
    assert [int(done) for done, *_ in lines] == list(range(1, len(lines) + 1))
    assert {name for _, _, name, _, _ in lines} >= {"fc2 tp2 chunks step0", "layer tp2"}
    assert 0 < 60 * int(lines[-1][3] or 0) + float(lines[-1][4]) < time.time() - t0
    assert "the report follows" not in p.stderr     # a rerun does not claim to know all it re-measures
    after = {rel: started(w, rel) for rel in before}
    assert after["qkv/tp2/chunks/step0"] == before["qkv/tp2/chunks/step0"]
    assert after["qkv/tp2/point"] == before["qkv/tp2/point"]
    assert after["fc2/tp2/chunks/step0"] > before["fc2/tp2/chunks/step0"]
    assert after["layer/tp2"] > before["layer/tp2"]
    report = (w / RUN / "report.md").read_text()
    assert "Run failed" not in report and "No setting failed." in report
    assert json.loads((w / RUN / "status.json").read_text()) == {"ok": True}
    assert "Nothing to be done" in smk(w, "-n").stdout


def test_rederive_reproduces_the_run(run):
    """tptune rederive of an unchanged, finished run writes what the workflow wrote. Before: the TP
    evidence's trace verdicts became null and the measurement count went from 28 to 31 (the layer
    sessions were collected too)."""
    import polars as pl

    w = run["dir"]
    copy_dir = "outputs/integrity-rd"
    shutil.copytree(w / RUN, w / copy_dir)
    try:
        p = subprocess.run([sys.executable, "-m", "tptune", "rederive", copy_dir], cwd=w, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        for f in ("decisions.json", "chunked_cfg.tp2.yaml", "report.md",
                  "layer/tp2.json", "search/qkv/final.json", "search/fc2/tp2/point.json"):
            assert (w / copy_dir / f).read_text() == (w / RUN / f).read_text(), f
        assert pl.read_parquet(w / copy_dir / "measurements.parquet").equals(
            pl.read_parquet(w / RUN / "measurements.parquet"))
    finally:
        shutil.rmtree(w / copy_dir)


# Every run-config setting, classified: "measure" settings change a measurement (their change re-measures
# the sessions they touch, here on the torch CPU run), every other one only derives (decisions, configs,
# report), runs the machinery, or does nothing on this backend: its change re-measures nothing.
# (key path, new value, re-measures on this run)
SETTINGS = [
    ("timing.warmup", 2, True), ("timing.iters", 4, True), ("timing.min_rounds", 1, True),
    ("timing.max_rounds", 3, True), ("timing.futility", False, True), ("timing.mode", "events", True),
    ("timing.preroll_ms", 100, True), ("timing.window_ms", 250, True), ("timing.lead_in", True, True),
    ("timing.profile_steps", 2, True),
    ("decision.noise_floor", 0.03, True), ("decision.step_margin", 0.015, True),
    ("decision.tp_tolerance", 0.5, False), ("decision.explore_all_tps", True, False),
    ("decision.trust_verdict", True, False), ("decision.min_hidden_fraction", 0.5, False),
    ("decision.min_tp", 2, False),
    ("search.chunks", [2, 4, 8], True), ("search.mode", "grid", False), ("search.runner_up", False, False),
    ("search.num_sm", [2, 4], False), ("search.te_presets", [], False), ("search.pipeline", True, False),
    ("search.atomic_gemm", True, True), ("search.cga_size", 2, False), ("search.set_sm_margin", 1, False),
    ("search.te_methods", {"fprop": ["bulk"]}, False), ("search.knobs", {}, False),
    ("layer.num_layers", 3, True), ("layer.enabled", False, False), ("layer.bound", False, True),
    ("launcher.cpu_threads_per_rank", 2, True), ("launcher.env", {"X_TPTUNE": "1"}, True),
    ("launcher.multicast", True, True), ("launcher.retries", 3, False), ("launcher.case_timeout_s", 61, False),
    ("launcher.startup_timeout_s", 301, False), ("launcher.idle_timeout_s", 6, False),
    ("launcher.keep_idle_groups", False, False), ("launcher.cpu_slots", 4, False),
    ("launcher.pool_dir", "/tmp/elsewhere", False),
    ("parallel.dp", 2, False), ("parallel.pp", 2, False), ("parallel.distributed_optimizer", False, False),
    ("parallel.recompute", "full", False), ("parallel.memory_fraction", 0.8, False),
    ("parallel.memory_check", False, False),
    ("hardware.gpu_memory_gb", 80.0, False), ("hardware.gpu", "H100", False),
    ("hardware.peak_tflops_fp8", 1000.0, False), ("hardware.peak_tflops", 500.0, False),
    ("hardware.gemm_efficiency", 0.5, False), ("hardware.bus_gbps", 100.0, False), ("hardware.latency_us", 9.0, False),
    ("parallel.ep", 2, False), ("parallel.etp", 1, False),
    ("workload.packed_sequences", True, False), ("workload.sequence_parallel", False, False),
    ("workload.seq_length", 256, True), ("workload.micro_batch_size", 2, True), ("workload.dtype", "bf16", True),
    ("workload.recipe", "current", False), ("workload.fp8_format", "e4m3", False),   # FP8 only: nothing here
    ("workload.fp8_emulation", "bf16", False),
    # workload.packing (issue 53, docs/packing.md): one key alone is a packing block refused for its missing keys, and
    # this run has no packing stage; which keys re-measure the packed sessions: tests/search/test_packed_sessions.py
    ("workload.packing.lengths", "config/packing/rl-bimodal.txt", False), ("workload.packing.rule", "slime", False),
    ("workload.packing.max_token_len", 4096, False), ("workload.packing.seqs_per_step", 8, False),
    ("workload.packing.forward_passes", 1, False), ("workload.packing.capacities", [2048], False),
    ("workload.packing.seed", 1, False),
    ("gpus_per_node", 4, False), ("faults", {"qkv-tp2-none": "raise:0"}, False),
    ("op_settings", {"fc2": {"timing": {"iters": 4}}}, True),
    # the confirm stage (Megatron-LM's training loop) runs after decide and measures no session
    ("confirm.enabled", True, False), ("confirm.rounds", 5, False), ("confirm.iters", 40, False),
    ("confirm.timeout_s", 200, False), ("confirm.micro_batches", 8, False), ("confirm.max_layers", 3, False),
    ("confirm.max_rounds", 6, False), ("confirm.budget_s", 200, False), ("confirm.target_half_width", 0.01, False),
    ("confirm.megatron_lm", "/opt/Megatron-LM", False),
]


def _leaves(schema, prefix=""):
    for k, v in (schema.get("properties") or {}).items():
        if v.get("type") == "object" and v.get("properties") and k not in ("hardware",):
            yield from _leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}"


def _set(cfg, path, value):
    cfg = copy.deepcopy(cfg)
    *head, last = path.split(".")
    d = cfg
    for k in head:
        d = d.setdefault(k, {})
    d[last] = value
    return cfg


def _measurements(workdir, cfg):
    """Every session's measurement settings (what the measuring rules' params hold), for this run."""
    from tptune.search import measurement as wm
    from tptune.search import steps as wf
    from tptune.measure.preflight import resolve_here

    s = resolve_here(cfg, base_dir=workdir, check_hardware=False)
    run = workdir / RUN
    out = {}
    for op in s.ops:
        results = json.loads((run / f"search/{op}/tp2/results.json").read_text())
        out[f"{op}/point"] = wm.point_measurement(s, op, 2, results)
        for d in wf.dimensions(s, op, 2):
            out[f"{op}/{d}/step0"] = wm.step_measurement(s, op, 2, d, None)
    out["layer"] = wm.layer_measurement(s, 2)
    return out


def test_every_setting_is_classified_and_only_measure_settings_change_a_measurement(run):
    """For every setting of the schema (a new one must be classified here): changing it changes some
    session's measurement settings exactly when it is a measure setting."""
    from tptune.settings.resolve import SCHEMA

    w = run["dir"]
    classified = {k for k, _, _ in SETTINGS}
    schema_keys = set(_leaves(SCHEMA)) - {"run", "model", "backend", "ops", "tp_sizes", "hardware"}
    schema_keys |= {f"hardware.{k}" for k in SCHEMA["properties"]["hardware"]["properties"]}
    # the launcher block is free-form in the schema: its settings are the defaults' keys
    schema_keys = (schema_keys - {"launcher"}) | {f"launcher.{k}" for k in base_config(w / "pool")["launcher"]}
    assert schema_keys - classified == set(), "classify these settings (measure or not)"
    base = cfg_dict(w)
    ref = _measurements(w, base)
    for key, value, measures in SETTINGS:
        try:
            got = _measurements(w, _set(base, key, value))
        except Exception as exc:  # noqa: BLE001 - a setting this run cannot take (e.g. TE only) changes nothing here
            assert not measures, f"{key}: {exc}"
            continue
        changed = sorted(k for k in ref if got.get(k) != ref[k])
        assert bool(changed) == measures, (key, changed)


@pytest.mark.parametrize("block,measure,derive", [
    ("timing", {"timing": {"iters": 4}}, None),
    ("decision", {"decision": {"noise_floor": 0.03}},
     {"decision": {"tp_tolerance": 0.5, "trust_verdict": True, "min_hidden_fraction": 0.5}}),
    ("search", {"search": {"chunks": [2, 4, 8]}}, {"search": {"runner_up": False}}),
    ("layer", {"layer": {"num_layers": 3}}, None),
    ("launcher", {"launcher": {"cpu_threads_per_rank": 2}}, {"launcher": {"retries": 3, "idle_timeout_s": 9}}),
    ("parallel+hardware", None, {"parallel": {"memory_fraction": 0.8}, "hardware": {"gpu_memory_gb": 80.0}}),
    ("workload", {"workload": {"seq_length": 256}}, None),
])
def test_a_change_re_measures_only_what_it_touches(run, block, measure, derive):
    """Real Snakemake, both directions per block: a measure setting plans measuring jobs; a decision-only
    (or machinery) setting plans none but re-derives the decisions and the report. Before:
    decision.tp_tolerance re-measured every session (the measuring params held the whole decision block)."""
    w = run["dir"]
    for over, measures in ((measure, True), (derive, False)):
        if over is None:
            continue
        write(w, "changed.yaml", over)
        p = smk(w, "-n", configs=("run.yaml", "changed.yaml"))
        assert p.returncode == 0, p.stderr[-2000:]
        jobs = planned(p.stdout)
        if measures:
            assert set(jobs) & set(MEASURING), (over, jobs)
        else:
            # search.runner_up re-derives the search steps; what the points then measure is decided
            # after them (a dry run lists the point sessions behind a checkpoint it cannot run)
            assert not {"measure_step", "layer"} & set(jobs), (over, jobs)
            assert {"decide", "report"} <= set(jobs), (over, jobs)
            if over.get("decision") or over.get("launcher") or over.get("parallel"):
                assert "measure_point" not in jobs, (over, jobs)


def test_dry_run_and_an_invocation_beside_a_running_one_change_nothing(run):
    """Before: config.json was rewritten at parse time by `snakemake -n --configfile changed.yaml` and by
    a second invocation beside a running one, whose remaining jobs then read it."""
    w = run["dir"]
    cfg_json = w / RUN / "config.json"
    text = cfg_json.read_text()
    write(w, "changed.yaml", {"timing": {"iters": 7}})
    assert smk(w, "-n", configs=("run.yaml", "changed.yaml")).returncode == 0
    assert cfg_json.read_text() == text
    # a running invocation (re-measuring the layer stage) and, beside it, one with other settings whose
    # jobs Snakemake's own lock does not cover (one session as target)
    first = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "run.yaml",
                              "-R", f"{RUN}/layer/tp2.json"], cwd=w, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        lock = w / RUN / ".run.lock"
        while time.time() < deadline and not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            time.sleep(0.2)
        assert lock.read_text().strip() == str(first.pid)
        # jobs that overlap the running ones: Snakemake's lock refuses it
        second = smk(w, f"{RUN}/sessions/qkv/tp2/chunks/step0/session.json",
                     configs=("run.yaml", "changed.yaml"))
        assert second.returncode != 0 and cfg_json.read_text() == text
        # its holder runs: no word of a lock left by a snakemake that is gone (records.run_lock)
        assert "snakemake --unlock" not in second.stdout + second.stderr
        # jobs Snakemake's lock does not cover (the window calibration, which the running one has not):
        # the run's lock refuses it, before it writes anything
        write(w, "changed.yaml", {"timing": {"iters": 7, "window_ms": "auto"}})
        third = smk(w, f"{RUN}/calibration/window.json", configs=("run.yaml", "changed.yaml"))
        assert third.returncode != 0
        assert "being run by another snakemake" in third.stdout + third.stderr, third.stderr[-2000:]
        assert cfg_json.read_text() == text and not (w / RUN / "calibration").exists()
    finally:
        out, _ = first.communicate(timeout=900)
    assert first.returncode == 0, out[-3000:]
    assert json.loads((w / RUN / "sessions/layer/tp2/session.json").read_text())["settings"]["timing"]["iters"] == 3
    assert cfg_json.read_text() == text


def test_a_job_refuses_a_config_json_changed_under_it(run):
    """A measuring job scheduled with one set of settings never measures with another."""
    w = run["dir"]
    cfg = json.loads((w / RUN / "config.json").read_text())
    cfg["timing"]["iters"] = 9
    other = w / RUN / "other-config.json"
    other.write_text(json.dumps(cfg))
    from tptune.search import measurement as wm
    from tptune.cli.main import _settings
    before = started(w, "qkv/tp2/chunks/step0")
    expect = wm.settings_digest(wm.step_measurement(_settings(str(w / RUN / "config.json"), calibrated=False),
                                                    "qkv", 2, "chunks", None))
    p = subprocess.run([sys.executable, "-m", "tptune", "measure-step", "--config", str(other), "--op", "qkv",
                        "--tp", "2", "--dim", "chunks", "--step", "0", "--expect", expect],
                       cwd=w, capture_output=True, text=True)
    other.unlink()
    assert p.returncode == 2 and "other measurement settings" in p.stderr
    assert started(w, "qkv/tp2/chunks/step0") == before


def test_one_session_or_one_core_is_never_measured_by_two_processes_at_once(run):
    """Before: after a kill -KILL of snakemake, its orphaned job and the rerun's measured one session at
    once, and two runs in one folder measured on the same cores at once (CPU slots were not cores).
    Here: two processes measuring one session (the orphan and the rerun), then two runs' sessions on one
    pool at the same time; every run.json records what it held."""
    w = run["dir"]

    def measure(run_dir):
        return subprocess.Popen([sys.executable, "-m", "tptune", "measure-step", "--config",
                                 f"{run_dir}/config.json", "--op", "qkv", "--tp", "2", "--dim", "chunks",
                                 "--step", "0"], cwd=w, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    procs = [measure(RUN), measure(RUN)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert sum("being measured by another process" in o for o in outs) == 1, outs
    sess = json.loads((w / RUN / "sessions/qkv/tp2/chunks/step0/session.json").read_text())
    assert sess["held"]["waited_for_session_s"] > 0      # the later one waited, then measured alone
    other = "outputs/integrity-b"
    shutil.copytree(w / RUN, w / other)
    procs = [measure(RUN), measure(other)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    held = [json.loads((w / d / "sessions/qkv/tp2/chunks/step0/session.json").read_text())["held"]
            for d in (RUN, other)]
    a, b = held
    if set(a["ids"]) & set(b["ids"]):     # the same cores: one after the other
        assert a["until"] <= b["from"] or b["until"] <= a["from"], held
    for d in (RUN, other):
        for rj in (w / d / "sessions/qkv/tp2/chunks/step0").glob("*/run.json"):
            rec = json.loads(rj.read_text())["held"]
            assert rec["device"] == "cpu" and rec["ids"] and rec["pool"]
    shutil.rmtree(w / other)
