"""The files tptune emits come as coherent sets (issue 33): a property over every combination the search
can hand decide, and the set writer on a real run folder."""
from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
import yaml

from tptune.model.ops import OPS
from tptune.te import megatron_flags as mf
from tptune.te.check import check_pair, read_flags, switches_from_overrides
from tptune.te.methods import knob_candidates, with_knob
from tptune.te.ubcfg import compose_ub_cfgs, load_preset, op_entries
from tptune.records.run_dir import RunDir

ROOT = Path(__file__).resolve().parents[2]
KNOBS = ROOT / "results" / "knobs-llama3-70b-x2"


def _op_options(op: str) -> list[dict]:
    """Every distinct per-op setting the knob search's mode-changing groups (method, rs_dgrad) reach from TE's
    defaults and NVIDIA's presets: what a TP point can hand decide for ``op``."""
    out = []
    for base in (load_preset("te"), load_preset("nemo_tp4"), load_preset("nvidia_bf16_tp2")):
        out.append(op_entries(base, op))
        for group, per in knob_candidates(op, 2, base, {"groups": ["method", "rs_dgrad"]}).items():
            for gemm, values in per.items():
                for v in values:
                    out.append(op_entries(with_knob(base, gemm, group, v), op))
    uniq = []
    for o in out:
        if o not in uniq:
            uniq.append(o)
    return uniq


def test_no_combination_the_search_can_produce_is_emitted_inconsistent():
    """decide composes the per-op choices and derives Megatron's switches from them (block_switches): each
    combination is either refused there (decide then restricts it to one the switches express, itself a
    combination of this space) or the pair is run as written (te.check), so the guard in decide.file_sets never
    has to withhold a set the search produced."""
    options = {op: _op_options(op) for op in OPS}
    assert all(len(v) >= 2 for v in options.values()), {op: len(v) for op, v in options.items()}
    for op in ("qkv", "fc1"):   # both dgrad modes reach decide
        assert {mf.op_mode(op, o) for o in options[op]} == {"bulk", "rs_dgrad"}
    written = refused = 0
    for combo in itertools.product(*(options[op] for op in OPS)):
        ub = compose_ub_cfgs(dict(zip(OPS, combo)))
        try:
            sw = mf.block_switches(ub)
        except ValueError:
            refused += 1
            continue
        res = check_pair(ub, sw)
        assert res.ok, (combo, [p.line() for p in res.problems])
        written += 1
    assert written and refused   # both kinds occur: mixed qkv/fc1 dgrad modes are refused


def test_a_rederived_run_writes_one_set_per_tp_and_removes_another_decisions_files(tmp_path):
    """The knob run re-derived: its TP 2 set and the plain-named copy, each yaml with its own switches that
    tptune check passes; files an earlier decision left (a yaml of another TP) are removed, not kept beside."""
    from tptune.cli.rederive import rederive
    from tptune.measure.preflight import resolve_here

    run = tmp_path / "run"
    shutil.copytree(KNOBS, run)
    (run / "tp_comm_overlap_cfg.tp4.yaml").write_text((run / "tp_comm_overlap_cfg.yaml").read_text())
    (run / "megatron_flags.txt").write_text("--tp-comm-overlap\n")   # another decision's switches
    cfg = json.loads((run / "config.json").read_text())
    cfg.pop("_source", None), cfg.pop("_base_dir", None)
    rederive(resolve_here(cfg, base_dir=ROOT, check_hardware=False), RunDir(run))
    files = json.loads((run / "decisions.json").read_text())["meta"]["files"]
    assert files["default"] == "2" and set(files["sets"]) == {"2"}
    assert not (run / "tp_comm_overlap_cfg.tp4.yaml").exists()
    for names in (files["sets"]["2"]["files"], files["default_files"]):
        ub = yaml.safe_load((run / names["ub_cfgs_yaml"]).read_text())
        sw = switches_from_overrides(run / names["overrides"])
        assert check_pair(ub, sw).ok
        flag_sw, named = read_flags(run / names["megatron_flags"])
        assert named == names["ub_cfgs_yaml"] and check_pair(ub, flag_sw).ok
        assert json.loads((run / names["ub_cfgs_json"]).read_text()) == ub
    assert files["sets"]["2"]["status"] == "proven" and files["sets"]["2"]["check"]["ok"]


@pytest.mark.parametrize("status", ["failed"])
def test_a_tp_whose_every_overlapped_block_setting_failed_gets_no_files(tmp_path, status):
    """The layer record of a TP where the numerics failed every overlapped setting: no set is written for it,
    and no plain-named copy, and decisions.json says why."""
    from tptune.cli.rederive import rederive
    from tptune.measure.preflight import resolve_here

    run = tmp_path / "run"
    shutil.copytree(KNOBS, run)
    cfg = json.loads((run / "config.json").read_text())
    cfg.pop("_source", None), cfg.pop("_base_dir", None)
    s = resolve_here(cfg, base_dir=ROOT, check_hardware=False)
    # plant a failed numerics verdict on every overlapped block setting's recorded run
    for rj in (run / "sessions" / "layer" / "tp2").glob("*/run.json"):
        r = json.loads(rj.read_text())
        if "-ub." in r.get("case", rj.parent.name) or rj.parent.name.startswith("ub."):
            r["correctness"] = {"ok": False, "failed": ["input_grad"], "criterion": "planted"}
            rj.write_text(json.dumps(r))
    rederive(s, RunDir(run))
    files = json.loads((run / "decisions.json").read_text())["meta"]["files"]
    assert files["sets"]["2"]["status"] == status and files["sets"]["2"]["files"] == {}
    assert files["default"] is None
    assert not list(run.glob("tp_comm_overlap_cfg*.yaml")) and not list(run.glob("megatron_flags*.txt"))
    assert "no overlapped setting passed" in files["sets"]["2"]["why"]


def test_without_a_block_mixed_dgrad_choices_are_restricted_to_one_switch_set_and_marked_unproven(tmp_path):
    """Issue 33's corrupting case: qkv chose bulk dgrad, fc1 a reduce-scatter dgrad, and no block proved
    the combination. One tp_comm_overlap_rs_dgrad cannot serve both, so decide writes the per-op choices
    within one dgrad mode (the likelier by the ops' estimates), checked, marked UNPROVEN in the file."""
    from tptune.cli.stages import write_file_sets
    from tptune.decide.file_sets import te_sets
    from tptune.decide.answer import recorded_points
    from tptune.measure.preflight import resolve_here

    cfg = json.loads((KNOBS / "config.json").read_text())
    cfg.pop("_source", None), cfg.pop("_base_dir", None)
    cfg["layer"]["enabled"] = False
    s = resolve_here(cfg, base_dir=ROOT, check_hardware=False)
    points = {op: recorded_points(RunDir(KNOBS), op, [2]) for op in OPS}
    # the search result of a run whose qkv reduce-scatter dgrad failed: qkv's best is a bulk setting
    qkv = points["qkv"][2]
    qkv["candidates"] = {c: p for c, p in qkv["candidates"].items() if "dgrad.ring" not in c}
    meta = {"model": "llama3-70b", "workload": {"seq_length": 8192}, "model_tp": 2}
    sets, written = te_sets(s, RunDir(tmp_path), points, {}, [2], meta)
    write_file_sets(RunDir(tmp_path), written)
    rec = sets["2"]
    assert rec["status"] == "unproven" and "restricted to the bulk dgrad combination" in rec["why"], rec["why"]
    ub = yaml.safe_load((tmp_path / "tp_comm_overlap_cfg.tp2.yaml").read_text())
    assert mf.op_mode("fc1", op_entries(ub, "fc1")) == mf.op_mode("qkv", op_entries(ub, "qkv")) == "bulk"
    assert check_pair(ub, switches_from_overrides(tmp_path / "transformer_config_overrides.tp2.yaml")).ok
    assert "# UNPROVEN" in (tmp_path / "tp_comm_overlap_cfg.tp2.yaml").read_text()
