"""Strict configs and a CLI that takes what a user has (issue 27): cross-field rules refused at validation
(and so at the workflow's parse time), TP sizes the node cannot hold refused before any job, every
subcommand taking a run YAML over config/config.yaml or a run's config.json, or saying what it expects,
and no traceback for a bad input or a closed pipe. User-facing behaviour runs the real `tptune` CLI."""
import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config
from tptune.measure import gpupool
from tptune.errors import ConfigError
from tptune.measure.preflight import resolve_here

TINY = str(ROOT / "config" / "models" / "tiny.yaml")
TRACE = ROOT / "tests" / "fixtures" / "traces" / "te_qkv_base.rank0.pt.trace.json.gz"


def tptune(cwd, *args, env=None):
    """The CLI as a user runs it, from ``cwd`` (no config/ there: the defaults come from the checkout)."""
    full = {k: v for k, v in os.environ.items() if k != "TPTUNE_SUBMIT_ONLY"}
    full.update(env or {})
    p = subprocess.run([sys.executable, "-m", "tptune", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                       timeout=120, env=full)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def run_yaml(tmp_path, name="my-run.yaml", **cfg):
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"model": TINY, **cfg}))
    return path


# -- every subcommand takes what a user has -----------------------------------------------------------

def test_plan_and_model_take_a_run_yaml_layered_over_the_defaults(tmp_path):
    """Was: JSONDecodeError (they read only a run's config.json)."""
    cfg = run_yaml(tmp_path, ops=["qkv"], tp_sizes=[2])
    p = tptune(tmp_path, "plan", "--config", cfg, "--out", tmp_path / "plan.parquet")
    assert p.returncode == 0, p.stderr
    import polars as pl
    plan = pl.read_parquet(tmp_path / "plan.parquet")
    assert set(plan["op"]) == {"qkv"} and set(plan["tp"]) == {2}
    p = tptune(tmp_path, "model", "--config", cfg, "--out", tmp_path / "model.json")
    assert p.returncode == 0, p.stderr
    assert json.loads((tmp_path / "model.json").read_text())["model"]["hidden_size"] == 512
    # a second YAML layers over the first, as snakemake --configfile a b does
    over = tmp_path / "over.yaml"
    over.write_text("ops: [fc1, fc2]\n")
    assert tptune(tmp_path, "plan", "--config", cfg, "--config", over, "--out", tmp_path / "p2.parquet").returncode == 0
    assert set(pl.read_parquet(tmp_path / "p2.parquet")["op"]) == {"fc1", "fc2"}


def test_plan_takes_a_runs_recorded_config_json(tmp_path):
    """The workflow's own use: outputs/<run>/config.json (every setting resolved, read as recorded)."""
    run = tmp_path / "outputs" / "r"
    run.mkdir(parents=True)
    cfg = {**base_config(tmp_path / "pool", ops=["fc2"], tp_sizes=[4]), "_source": "run config", "_base_dir": "."}
    (run / "config.json").write_text(json.dumps(cfg))
    p = tptune(tmp_path, "plan", "--config", run / "config.json", "--out", tmp_path / "plan.parquet")
    assert p.returncode == 0, p.stderr
    import polars as pl
    assert set(pl.read_parquet(tmp_path / "plan.parquet")["tp"]) == {4}
    p = tptune(tmp_path, "plan", "--config", run / "config.json", "--config", run_yaml(tmp_path), "--out", "x.parquet")
    assert p.returncode == 2 and "give it alone" in p.stderr


def test_a_step_that_reads_a_run_folder_says_it_wants_config_json(tmp_path):
    cfg = run_yaml(tmp_path)
    p = tptune(tmp_path, "report", "--config", cfg, "--out", tmp_path / "report.md")
    assert p.returncode == 2
    assert "expected a run's outputs/<run>/config.json" in p.stderr and "tptune validate" in p.stderr


def test_validate_layers_a_run_yaml_over_the_defaults(tmp_path):
    """Was: a run YAML without config/config.yaml first reported ops/model/tp_sizes missing."""
    cfg = tmp_path / "my-run.yaml"
    cfg.write_text("run: mine\nmodel: " + TINY + "\n")
    p = tptune(tmp_path, "validate", cfg)
    assert p.returncode == 0, p.stderr
    assert "run=mine" in p.stdout and "tp=[2, 4]" in p.stdout


def test_validate_on_a_submit_host_does_not_ask_for_the_gpu(tmp_path):
    """Was: with TPTUNE_SUBMIT_ONLY=1 set, validate still asked the user to set it (te needs CUDA GPUs)."""
    cfg = run_yaml(tmp_path, backend="te")
    here = tptune(tmp_path, "validate", cfg)
    assert here.returncode == 2 and "te needs CUDA GPUs" in here.stderr
    submit = tptune(tmp_path, "validate", cfg, env={"TPTUNE_SUBMIT_ONLY": "1"})
    assert submit.returncode == 0, submit.stderr
    assert "backend=te" in submit.stdout and "hardware not checked" in submit.stdout


def test_a_model_file_or_a_list_given_as_run_config_is_named(tmp_path):
    p = tptune(tmp_path, "validate", TINY)
    assert p.returncode == 2 and "this is a model file, not a run config" in p.stderr and f"model: {TINY}" in p.stderr
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    p = tptune(tmp_path, "plan", "--config", "list.yaml", "--out", "p.parquet")
    assert p.returncode == 2 and "list.yaml" in p.stderr and "expected a mapping" in p.stderr
    p = tptune(tmp_path, "model", "--config", "typo.yaml", "--out", "m.json")
    assert p.returncode == 2 and "typo.yaml" in p.stderr and "file not found" in p.stderr


def test_rederive_of_a_typod_path_says_the_folder_does_not_exist(tmp_path):
    """Was: "this run was recorded before side-by-side sessions"."""
    p = tptune(tmp_path, "rederive", "outputs/typo")
    assert p.returncode == 2 and "outputs/typo: no such folder" in p.stderr
    (tmp_path / "outputs" / "empty").mkdir(parents=True)
    p = tptune(tmp_path, "rederive", "outputs/empty")
    assert p.returncode == 2 and "not a run folder: no config.json" in p.stderr


def test_hf_config_without_seq_length_names_workload_seq_length(tmp_path):
    """Was: "model file ...config.json: missing field 'seq_length'", blaming the model file."""
    cfg = run_yaml(tmp_path, model=str(ROOT / "tests" / "fixtures" / "hf" / "qwen2.5-32b.config.json"))
    p = tptune(tmp_path, "validate", cfg)
    assert p.returncode == 2 and "field 'workload.seq_length': required" in p.stderr
    assert "model file" not in p.stderr.split("workload.seq_length")[0]


def test_analyze_into_a_closed_pipe_ends_quietly(tmp_path):
    """Was: `tptune analyze ... | head` printed a BrokenPipeError traceback. The reader is gone before the
    first write here, as head is once it has its lines."""
    r, w = os.pipe()
    os.close(r)
    p = subprocess.run([sys.executable, "-m", "tptune", "analyze", str(TRACE)], stdout=w, stderr=subprocess.PIPE,
                       text=True, timeout=120)
    os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipeError" not in p.stderr, p.stderr
    assert p.returncode == 141


@pytest.mark.parametrize("content", [None, "not json {", "{}"], ids=["missing", "unparseable", "wrong-shape"])
def test_no_subcommand_shows_a_traceback_for_a_bad_input_file(tmp_path, capsys, monkeypatch, content):
    """Every subcommand, every required argument a file that is not there, not JSON/YAML, or the wrong
    shape: a non-zero exit and one message, never a traceback (in-process, through main(), the
    `tptune` script's entry). Was: JSONDecodeError/KeyError tracebacks (plan, model, analyze-case,
    join-json, ...). `failed` is left to the run-integrity work (it exits 0 on a missing folder)."""
    from tptune.cli.main import build_parser, main

    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    sub = next(a for a in build_parser()._actions if a.dest == "cmd")
    tried = []
    for name, parser in sub.choices.items():
        if name == "failed" or (name == "join-json" and content == "{}"):    # a JSON object is fine to join
            continue
        if name == "check" and content == "{}":     # an empty ub_cfgs is TE's defaults, which Megatron runs
            continue
        argv = [name]
        for act in parser._actions:
            if act.dest == "help" or not (act.required or (not act.option_strings and act.nargs not in ("*", "?"))):
                continue
            argv += ([act.option_strings[0]] if act.option_strings else []) + ["2" if act.type is int else str(bad)]
        if name == "analyze":
            argv = [name, str(bad)]
        capsys.readouterr()
        rc = main(argv)
        err = capsys.readouterr().err
        assert rc != 0, (argv, err)
        assert err.strip() and "Traceback" not in err, (argv, err)
        tried.append(name)
    assert {"validate", "plan", "model", "rederive", "report", "decide", "analyze-case", "analyze"} <= set(tried)


# -- cross-field rules ----------------------------------------------------------------------------

def test_min_rounds_above_max_rounds_is_refused(tmp_path):
    """Was accepted: the run did 5 rounds and reported "round budget (3) spent"."""
    p = tptune(tmp_path, "validate", run_yaml(tmp_path, timing={"min_rounds": 5, "max_rounds": 3}))
    assert p.returncode == 2 and "field 'timing.min_rounds' = 5 exceeds max_rounds = 3" in p.stderr
    # an op's own override is checked merged over the run's values, and named where it was given
    p = tptune(tmp_path, "validate", run_yaml(tmp_path, op_settings={"fc1": {"timing": {"max_rounds": 2}}},
                                              timing={"min_rounds": 3, "max_rounds": 4}))
    assert p.returncode == 2 and "field 'op_settings.fc1.timing.min_rounds' = 3 exceeds max_rounds = 2" in p.stderr
    assert "field 'timing.min_rounds'" not in p.stderr
    assert tptune(tmp_path, "validate", run_yaml(tmp_path, timing={"min_rounds": 3, "max_rounds": 3})).returncode == 0


def test_unknown_preset_is_refused_at_plan_time_naming_the_valid_ones(tmp_path):
    """Was: found only when a GPU job built it."""
    p = tptune(tmp_path, "plan", "--config", run_yaml(tmp_path, search={"te_presets": ["no_such_preset"]}),
               "--out", "p.parquet")
    assert p.returncode == 2 and "field 'search.te_presets': no preset 'no_such_preset'" in p.stderr
    assert "valid: te, launcher_h100_tp2, nemo_tp4, nemo_tp4_recipe, nvidia_bf16_tp2" in p.stderr
    p = tptune(tmp_path, "validate", run_yaml(tmp_path, op_settings={"qkv": {"search": {"te_presets": ["nemo_tp5"]}}}))
    assert p.returncode == 2 and "field 'op_settings.qkv.search.te_presets': no preset 'nemo_tp5'" in p.stderr


@pytest.mark.parametrize("over, expect", [
    ({"decision": {"step_margin": 0.05}}, "field 'decision.step_margin' = 0.05 exceeds decision.noise_floor = 0.02"),
    ({"decision": {"min_tp": 8}}, "field 'decision.min_tp' = 8 exceeds every TP in tp_sizes [2, 4]"),
    ({"tp_sizes": [2, 2]}, "field 'tp_sizes': 2 given more than once"),
    ({"faults": {"fc1-tp8-none": "raise:1"}}, "field 'faults.fc1-tp8-none': this run measures no such case"),
    ({"faults": {"fc1-tp2-none": "boom"}}, "field 'faults.fc1-tp2-none' = 'boom': expected \"raise:<rank>\""),
    ({"launcher": {"cpu_slot": 2}}, "field 'launcher.cpu_slot': unknown key (did you mean 'cpu_slots'? expected one of pool_dir"),
    ({"hardware": {"peak_tflop": 900}}, "field 'hardware.peak_tflop': unknown key"),
    ({"op_settings": {"fc1": {"timing": {"iters": "ten"}}}}, "field 'op_settings.fc1.timing.iters': matches none of its forms ('ten' is not of type 'integer'"),
    ({"op_settings": {"fc1": {"search": {"chunk": [2]}}}}, "field 'op_settings.fc1.search.chunk': unknown key"),
])
def test_settings_that_were_silently_misread_are_refused(pool_dir, over, expect):
    """Each was accepted (and then ignored or misapplied) before."""
    with pytest.raises(ConfigError) as e:
        resolve_here(base_config(pool_dir, **over))
    assert expect in str(e.value)


# -- the node must hold the TP sizes asked ---------------------------------------------------------

def test_tp_sizes_the_cpu_slots_cannot_hold_are_refused_before_any_job(workdir, pool_dir):
    """On CPU a rank takes one of launcher.cpu_slots: a run asking more is refused at parse time (no job,
    nothing under outputs/<run>/sessions), naming the slots and the TP sizes; a dry run and a submit
    host (TPTUNE_SUBMIT_ONLY=1) only plan, so they go on."""
    cfg = base_config(pool_dir, run="small", ops=["qkv"], tp_sizes=[2, 4], launcher={"cpu_slots": 1})
    cfg["model"] = "config/models/tiny.yaml"
    (workdir / "run.yaml").write_text(yaml.safe_dump(cfg))
    smk = [sys.executable, "-m", "snakemake", "--cores", "1", "--configfile", "run.yaml"]
    p = subprocess.run(smk, cwd=workdir, capture_output=True, text=True, timeout=300)
    assert p.returncode != 0
    assert "launcher.cpu_slots = 1" in p.stdout + p.stderr and "[2, 4]" in p.stdout + p.stderr
    assert not (workdir / "outputs" / "small" / "sessions").exists()
    assert subprocess.run(smk + ["-n"], cwd=workdir, capture_output=True, text=True, timeout=300).returncode == 0
    v = tptune(workdir, "validate", "run.yaml")
    assert v.returncode == 2 and "launcher.cpu_slots = 1" in v.stderr
    assert tptune(workdir, "validate", "run.yaml", env={"TPTUNE_SUBMIT_ONLY": "1"}).returncode == 0


def test_tp_sizes_beyond_the_gpus_seen_are_refused(pool_dir, monkeypatch):
    """A node whose driver lists one GPU (the driver probe stands in for the hardware; the rule is real):
    TP 2 and 4 are refused naming the GPU seen and the sizes asked; a measuring job checks only its own
    TP (Slurm grants a job the GPUs of its TP), and a dry run / submit host nothing."""
    monkeypatch.setattr(gpupool, "driver_gpu_count", lambda: 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    for key in ("SLURM_JOB_ID", "SLURM_JOBID"):
        monkeypatch.delenv(key, raising=False)
    cfg = base_config(pool_dir, tp_sizes=[2, 4])
    with pytest.raises(ConfigError) as e:
        resolve_here(cfg)
    msg = str(e.value)
    assert "this node shows 1 GPU(s) (CUDA_VISIBLE_DEVICES=0: 0)" in msg and "TP sizes [2, 4]" in msg
    assert resolve_here(cfg, check_hardware=False).device == "cuda"
    assert resolve_here(cfg, node_tps=[1]).device == "cuda"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert resolve_here(cfg).tp_sizes == [2, 4]


def test_faults_of_the_runs_own_cases_are_accepted(pool_dir):
    """Its op/TP cases, the layer stage's, and TP 1 (the window calibration's cases)."""
    faults = {"fc2-tp2-none": "raise:1", "layer-tp2-none": "exit:0", "qkv-tp1-nocomm": "hang:0"}
    assert resolve_here(base_config(pool_dir, tp_sizes=[2], faults=faults)).faults == faults
