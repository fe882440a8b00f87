"""search.mode knobs through the real workflow code: the checkpoint steps' records over session
folders written as Launcher.session writes them, the TP point's members, the config checks, and the
plan of jobs Snakemake makes for it on a machine without GPUs."""
import json
import math
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config
from tptune.cases import parse_case_id
from tptune.errors import ConfigError
from tptune.measure.launch import write_run_json
from tptune.te.methods import grid_size
from tptune.records.point_fields import make_point
from tptune.te.ubcfg import case_ub_cfgs
from tptune.measure.preflight import resolve_here
from tptune.search.steps import dimensions, point_members, step_cases, step_record
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session

ROUND_FACTORS = [1.0, 1.012, 0.991, 1.004]      # drift shared by every member of a session
GPU_S = 5.0                                      # per session, as session.json records it


def _settings(pool_dir, ops=("proj", "qkv"), **search):
    cfg = base_config(pool_dir, backend="te", ops=list(ops), tp_sizes=[2], workload={"dtype": "bf16"},
                      hardware={"gpu_memory_gb": 139.8},
                      search={"mode": "knobs", "te_presets": ["nvidia_bf16_tp2"], **search})
    return resolve_here(cfg, check_hardware=False)


def pipeline_sm8(cfgs: dict) -> float:
    """proj: pipelined fprop beats ring_exchange; its num_sm is unimodal with the minimum at 8;
    no other knob moves time."""
    f = cfgs["proj_fprop"]
    if f["method"] != "pipeline":
        return 11.0
    return 10.0 + 0.4 * abs(math.log2(f["num_sm"]) - 3)


def write_session(run_dir, rel: str, case_ids: list[str], model=pipeline_sm8) -> None:
    """A session folder as Launcher.session leaves it: one run.json per member in its own folder,
    session.json mapping each case id to it."""
    d = run_dir / rel
    runs = {}
    for cid in case_ids:
        case = parse_case_id(cid)
        t = {"none": 12.0, "nocomm": 9.0}.get(case.variant.kind) or model(case_ub_cfgs(case))
        vals = [t * f for f in ROUND_FACTORS]
        point = make_point(cid, vals).to_dict()
        point["timing"]["total_ms"].update(rounds=vals, round_ids=list(range(len(vals))))
        (d / case.dir_name).mkdir(parents=True)
        write_run_json(d / case.dir_name, {**point, "op": case.op, "tp": case.tp, "variant": case.variant_id,
                                           "session": rel, "error": None})
        runs[cid] = f"{case.dir_name}/run.json"
    (d / "session.json").write_text(json.dumps({
        "session": rel, "tp": 2, "members": case_ids, "contenders": case_ids, "runs": runs,
        "order": [case_ids] * len(ROUND_FACTORS), "rounds": len(ROUND_FACTORS), "stop": "round budget",
        "failed": [], "canary": None, "wall_s": GPU_S / 2, "held_s": GPU_S / 2, "gpu_s": GPU_S}))


def run_search(s, run_dir, op="proj", model=pipeline_sm8, limit=60):
    """Step the knob search as the checkpoints do: measure what the previous record asks, record the
    step (through JSON, as the step files are), until a record says it is done."""
    prev, records = None, []
    for step in range(limit):
        cases = step_cases(s, op, 2, "knobs", prev)
        assert cases, f"step {step}: nothing to measure"
        write_session(run_dir, str(RunDir(".").step_session(op, 2, "knobs", step)),
                      [c.id for c in cases], model)
        rec = json.loads(json.dumps(step_record(s, op, 2, "knobs", step, prev, run_dir)))
        records.append(rec)
        if rec["done"]:
            return records
        prev = rec
    raise AssertionError("the knob search did not finish")


def test_knob_steps_find_pipeline_sm8_and_record_their_cost(tmp_path, pool_dir):
    s = _settings(pool_dir, knobs={"groups": "all"})
    assert list(dimensions(s, "proj", 2)) == ["knobs"]
    records = run_search(s, tmp_path)
    first, last = records[0], records[-1]
    assert first["sessions"][0]["label"] == "refs" and first["sessions"][0]["step"] == 0
    for k, rec in enumerate(records):
        # what rules/common.smk walks: every step has its own session, the last one says done
        assert rec["step"] == k and rec["sessions"][-1]["step"] == k and len(rec["sessions"]) == k + 1
        assert rec["done"] == (rec is last) and rec["mode"] == "knobs" and rec["dim"] == "knobs"
        assert rec["next"] == rec["next_cases"]
        if not rec["done"]:
            assert rec["next_label"] == records[k + 1]["sessions"][-1]["label"]
            assert records[k + 1]["sessions"][-1]["values"] == rec["next"]
        for v in rec["sessions"][-1]["values"]:
            assert parse_case_id(v).id == v                       # case ids round-trip
        assert set(rec["measured"]) == {e["label"] for e in rec["sessions"]}
    assert last["next"] == [] and last["next_label"] is None
    assert last["best"] == last["best_case"]
    best = case_ub_cfgs(parse_case_id(last["best_case"]))["proj_fprop"]
    assert best["method"] == "pipeline" and best["num_sm"] == 8
    assert last["reference"] in ("te", "nvidia_bf16_tp2")
    assert [p["session"] for p in last["path"]][0] == "refs"
    cost = last["cost"]
    n = sum(len(e["values"]) for e in last["sessions"])
    assert cost["measurements"] == n == len(last["asked"])
    assert cost["sessions"] == len(records) and cost["gpu_s"] == pytest.approx(GPU_S * len(records))
    grid = grid_size("proj", 2, case_ub_cfgs(parse_case_id(f"proj-tp2-ub.{last['reference']}")),
                     config={"groups": "all"})
    assert cost["grid_size"] == grid
    assert cost["grid_gpu_s_est"] == pytest.approx(grid * GPU_S * len(records) / n)
    assert cost["ratio"] == pytest.approx(n / grid) and cost["ratio"] < 0.25
    sm = [c for c in last["changes"] if c["group"] == "num_sm"]
    assert sm and sm[-1]["moved"] and any(d.startswith("proj_fprop.num_sm ") and d.endswith("→8")
                                              for d in sm[-1]["diff"])
    assert sm[-1]["kept_ratio"] < 1
    frozen = {c["group"]: c for c in last["changes"] if not c["moved"]}
    assert {"method", "use_ce", "set_sm_margin", "cga_size", "num_splits", "priority"} <= set(frozen)
    assert frozen["cga_size"]["diff"] == ["proj_fprop.cga_size 2→1"]     # frozen at its cheapest value
    # a replay of the same sessions (rederive) gives the same record
    assert json.loads(json.dumps(step_record(s, "proj", 2, "knobs", len(records) - 1, records[-2], tmp_path))) == last


def test_the_tp_point_measures_the_winner_beside_the_references(tmp_path, pool_dir):
    s = _settings(pool_dir)
    last = run_search(s, tmp_path)[-1]
    members, tuned = point_members(s, "proj", 2, [last])
    ids = [c.id for c in members]
    assert ids[:4] == ["proj-tp2-none", "proj-tp2-nocomm", "proj-tp2-ub.te", "proj-tp2-ub.nvidia_bf16_tp2"]
    assert [c.id for c in tuned] == [last["best_case"]] and last["best_case"] in ids


def test_decisions_and_report_of_a_knob_run(tmp_path, pool_dir):
    """A whole knobs-mode run re-derived from its recorded sessions (the search steps, the TP point
    with the references and the winner) through decisions.json and report.md."""
    from tptune.model.plan import Hardware, build_plan
    from tptune.cli.rederive import rederive

    s = _settings(pool_dir, ops=["proj"])
    run = tmp_path / "run"
    records = run_search(s, run)
    for rec in records:
        (run / f"search/proj/tp2/knobs/step{rec['step']}.json").parent.mkdir(parents=True, exist_ok=True)
        (run / f"search/proj/tp2/knobs/step{rec['step']}.json").write_text(json.dumps(rec))
    members, _ = point_members(s, "proj", 2, [records[-1]])
    write_session(run, "sessions/proj/tp2/point", [c.id for c in members])
    build_plan(s.model, s.tp_sizes, Hardware.from_dict(s.hardware.as_dict()), s.ops).write_parquet(
        run / "plan.parquet")
    rederive(s, RunDir(run))
    dec = json.loads((run / "decisions.json").read_text())["ops"]["proj"]
    assert dec["config"]["case"] == records[-1]["best_case"]
    k = dec["knob_search"]["2"]
    assert k["reference"] == records[-1]["reference"] and k["cost"] == records[-1]["cost"]
    assert [c["group"] for c in k["changed"]] == ["num_sm"] and "method proj_fprop" in k["frozen"]
    report = (run / "report.md").read_text()
    line = next(x for x in report.splitlines() if x.startswith("- knob search at TP=2"))
    assert f"{k['cost']['sessions']} sessions" in line and "exhaustive grid" in line
    assert "Changed (beyond the noise): num_sm (proj_fprop.num_sm 16→8" in report
    assert "Frozen (cheapest value that ties): method proj_fprop" in report


def test_long_member_folders_are_hashed_and_read_back(tmp_path, pool_dir, monkeypatch):
    import tptune.cases as cases

    monkeypatch.setattr(cases, "MAX_DIR_NAME", 40)       # every spelled-out knob setting is longer
    s = _settings(pool_dir)
    records = run_search(s, tmp_path)
    recorded = load_session(tmp_path / records[-1]["sessions"][-1]["session"])
    sess, runs = recorded.record, recorded.points
    assert all(len(p.split("/")[0]) <= 40 and "+h" in p for p in sess["runs"].values())
    assert set(runs) == set(records[-1]["sessions"][-1]["values"])
    c = parse_case_id(records[-1]["best_case"])
    assert c.dir_name == parse_case_id(c.id).dir_name != c.variant_id   # stable


def test_knob_search_needs_the_te_backend(pool_dir):
    with pytest.raises(ConfigError, match=r"field 'search.mode': knobs .* needs backend te"):
        resolve_here(base_config(pool_dir, backend="torch", search={"mode": "knobs"}), check_hardware=False)
    with pytest.raises(ConfigError, match=r"field 'op_settings.fc1.search.mode': knobs"):
        resolve_here(base_config(pool_dir, backend="torch", op_settings={"fc1": {"search": {"mode": "knobs"}}}),
                     check_hardware=False)
    with pytest.raises(ConfigError, match=r"field 'search.knobs': knobs.num_sm"):
        resolve_here(base_config(pool_dir, backend="te", search={"mode": "knobs", "knobs": {"num_sm": [0]}}),
                     check_hardware=False)


def test_the_gpu_config_is_affordable():
    """config/gpu/h200x2-llama3-70b-knobs.yaml: 5-20 sessions per op where nothing moves."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from knob_sessions import count, flat
    from tptune.settings.resolve import load_config_files

    cfg = load_config_files(ROOT / "config/config.yaml", ROOT / "config/gpu/h200x2-llama3-70b-knobs.yaml")
    s = resolve_here(cfg, base_dir=ROOT, check_hardware=False)
    assert s.backend == "te" and s.ops == ["qkv", "proj", "fc1", "fc2"] and s.tp_sizes == [2]
    for op in s.ops:
        res, grid = count(s, op, 2, flat)
        assert 5 <= len(res.sessions) <= 20 and res.measurements < 0.01 * grid, op


@pytest.mark.slow
def test_dry_run_plans_the_first_knob_sessions(workdir, pool_dir):
    cfg = base_config(pool_dir, run="knobs", backend="te", ops=["proj", "qkv"], tp_sizes=[2],
                      search={"mode": "knobs", "te_presets": ["nvidia_bf16_tp2"]})
    cfg["model"] = "config/models/tiny.yaml"
    (workdir / "run.yaml").write_text(yaml.safe_dump(cfg))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--configfile", "run.yaml"],
                       cwd=workdir, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for op in ("proj", "qkv"):
        assert f"outputs/knobs/sessions/{op}/tp2/knobs/step0/session.json" in p.stdout
    assert "measure_step" in p.stdout and "knobs/step1" not in p.stdout


@pytest.mark.slow
def test_a_submit_host_without_gpus_submits_and_the_jobs_check_their_own_hardware(workdir, pool_dir):
    """TPTUNE_SUBMIT_ONLY=1 (a Slurm login node): the te workflow parses and runs its bookkeeping
    without a GPU; a measuring job run on this GPU-less host fails on its own, naming the problem."""
    import os

    cfg = base_config(pool_dir, run="submit", backend="te", ops=["proj"], tp_sizes=[2])
    cfg["model"] = "config/models/tiny.yaml"
    (workdir / "run.yaml").write_text(yaml.safe_dump(cfg))

    def smk(*targets, **env):
        return subprocess.run([sys.executable, "-m", "snakemake", *targets, "--cores", "2",
                               "--configfile", "run.yaml"], cwd=workdir, capture_output=True, text=True, timeout=300,
                              env={**os.environ, **env})

    p = smk("outputs/submit/model.json")
    assert p.returncode != 0 and "TPTUNE_SUBMIT_ONLY=1" in p.stdout + p.stderr
    p = smk("outputs/submit/model.json", TPTUNE_SUBMIT_ONLY="1")
    assert p.returncode == 0 and (workdir / "outputs/submit/model.json").exists(), p.stderr[-2000:]
    # te's default search is the knob search (settings.backend_defaults)
    p = smk("outputs/submit/sessions/proj/tp2/knobs/step0/session.json", TPTUNE_SUBMIT_ONLY="1")
    log = (workdir / "outputs/submit/logs/measure/proj-tp2-knobs-step0.log")
    assert p.returncode != 0 and "te needs CUDA GPUs" in log.read_text()


def qkv_rs_wins(cfgs: dict) -> float:
    """qkv: a ring-exchange reduce-scatter dgrad is 6% faster than any bulk pair; nothing else moves."""
    return 9.4 if cfgs["qkv_dgrad"]["method"] == "ring_exchange" else 10.0


def test_the_tp_point_also_measures_the_other_dgrad_mode(tmp_path, pool_dir):
    s = _settings(pool_dir)
    records = run_search(s, tmp_path, op="qkv", model=qkv_rs_wins)
    last = records[-1]
    best, alt = (case_ub_cfgs(parse_case_id(last[k])) for k in ("best_case", "alternative"))
    assert best["qkv_dgrad"]["method"] == "ring_exchange" and "qkv_wgrad" not in best
    assert alt["qkv_dgrad"]["method"] == "bulk"
    rs = next(c for c in last["changes"] if c["group"] == "rs_dgrad")
    assert rs["moved"] and "qkv_wgrad overlap dropped" in rs["diff"]
    members, tuned = point_members(s, "qkv", 2, [last])
    ids = [c.id for c in members]
    assert last["best_case"] in ids and [c.id for c in tuned] == [last["best_case"]]
    # the alternative is TE's defaults here (the best reference, bulk): measured under that name
    op_cfgs = [{k: v for k, v in case_ub_cfgs(c).items() if k.startswith("qkv_")} for c in members
               if c.variant.kind == "ub"]
    assert {k: v for k, v in alt.items() if k.startswith("qkv_")} in op_cfgs
