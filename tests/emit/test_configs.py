import json

import pytest
import yaml

from tptune.cases import parse_case_id
from tptune.model.ops import TE_GEMMS, Gemm
from tptune.te.ubcfg import case_ub_cfgs, load_preset, te_default_ub_cfgs
from tptune.decide.decision_record import decisions_record
from tptune.decide.file_sets import chunked_shape_map
from tptune.emit.configs import (write_chunked_cfg, write_decisions_json, write_tp_comm_overlap_cfg, write_ub_cfgs_json)
from tptune.records.point_fields import make_point


def test_overlap_cfg_yaml_loads_back_with_ten_keys(tmp_path):
    cfg = case_ub_cfgs(parse_case_id("proj-tp4-ub.nemo_tp4+fprop.ring"))
    path = write_tp_comm_overlap_cfg(tmp_path / "tp_comm_overlap_cfg.yaml", cfg, model="llama3-70b",
                                     workload={"seq_length": 8192, "micro_batch_size": 1}, tp=4)
    text = path.read_text()
    assert text.startswith("# ") and "llama3-70b" in text and "TP 4" in text
    loaded = yaml.safe_load(text)
    assert list(loaded) == list(TE_GEMMS)
    assert loaded["proj_fprop"] == {"method": "ring_exchange", "num_sm": 1, "cga_size": 1,
                                    "set_sm_margin": False, "aggregate": False, "use_ce": True}
    assert loaded["fc2_fprop"] == {"method": "pipeline", "num_sm": 16, "cga_size": 2,
                                   "set_sm_margin": True, "num_splits": 4}
    assert loaded["qkv_wgrad"] == {"method": "bulk", "num_sm": 24, "cga_size": 2, "set_sm_margin": False}


def test_only_keys_the_method_uses(tmp_path):
    loaded = yaml.safe_load(write_tp_comm_overlap_cfg(tmp_path / "c.yaml", te_default_ub_cfgs()).read_text())
    allowed = {"ring_exchange": {"num_sm", "cga_size", "set_sm_margin", "aggregate", "use_ce"},
               "pipeline": {"num_sm", "cga_size", "set_sm_margin", "num_splits"},
               "bulk": {"num_sm", "cga_size", "set_sm_margin"}}
    for name, entry in loaded.items():
        assert set(entry) - {"method"} <= allowed[entry["method"]], name


def test_incomplete_or_invalid_configs_are_refused(tmp_path):
    cfg = te_default_ub_cfgs()
    del cfg["fc2_dgrad"]
    with pytest.raises(ValueError, match="fc2_dgrad"):
        write_tp_comm_overlap_cfg(tmp_path / "c.yaml", cfg)
    cfg = te_default_ub_cfgs()
    cfg["qkv_fprop"] = {"method": "pipeline"}
    with pytest.raises(ValueError, match="qkv_fprop"):
        write_ub_cfgs_json(tmp_path / "c.json", cfg)
    assert not (tmp_path / "c.yaml").exists() and not (tmp_path / "c.json").exists()


def test_fp8_knobs_reach_the_emitted_files_only_for_fp8(tmp_path):
    """An FP8 run's fp8_buf on a pipelined reduce-scatter (where TE honours it) is written out as it is;
    the same entry in a bf16 file is refused, naming the knob."""
    cfg = te_default_ub_cfgs()
    cfg["proj_fprop"] = {**cfg["proj_fprop"], "fp8_buf": 1}
    y = yaml.safe_load(write_tp_comm_overlap_cfg(tmp_path / "f.yaml", cfg, fp8=True).read_text())
    j = json.loads(write_ub_cfgs_json(tmp_path / "f.json", cfg, fp8=True).read_text())
    assert y["proj_fprop"]["fp8_buf"] is True and j == y
    with pytest.raises(ValueError, match="fp8_buf"):
        write_tp_comm_overlap_cfg(tmp_path / "b.yaml", cfg)


def test_ub_cfgs_json_matches_yaml(tmp_path):
    cfg = load_preset("nemo_tp4")
    j = json.loads(write_ub_cfgs_json(tmp_path / "ub.json", cfg).read_text())
    y = yaml.safe_load(write_tp_comm_overlap_cfg(tmp_path / "ub.yaml", cfg).read_text())
    assert j == y


def g(op, gemm, m, k, n, coll="all_gather"):
    return Gemm(op, 4, gemm, m, k, n, coll, m * k)


def test_chunked_shape_map_keys_by_unsplit_shape(tmp_path):
    choices = {g("qkv", "fprop", 8192, 8192, 2560): 4, g("fc2", "fprop", 8192, 7168, 8192, "reduce_scatter"): 1,
               g("fc2", "wgrad", 7168, 8192, 8192, "none"): 8}
    m = chunked_shape_map(choices)
    assert m == {"customized_cc": {"[8192, 8192, 2560]": 4, "[8192, 7168, 8192]": 1}}
    text = write_chunked_cfg(tmp_path / "cc_cfg.yaml", m).read_text()
    assert '"[8192, 8192, 2560]": 4' in text or "'[8192, 8192, 2560]': 4" in text
    assert yaml.safe_load(text) == m


def test_chunked_shape_map_conflicts():
    same = [(g("qkv", "fprop", 64, 64, 64), 2), (g("fc1", "fprop", 64, 64, 64), 4)]
    with pytest.raises(ValueError, match=r"\[64, 64, 64\]"):
        chunked_shape_map(same)
    assert chunked_shape_map([(g("qkv", "fprop", 64, 64, 64), 2), (g("fc1", "fprop", 64, 64, 64), 2)]) \
        == {"customized_cc": {"[64, 64, 64]": 2}}
    with pytest.raises(ValueError, match="chunk count"):
        chunked_shape_map([(g("qkv", "fprop", 64, 64, 64), 0)])


def test_decisions_record_and_json(tmp_path):
    win = make_point("qkv-tp4-ub.te+dgrad.bulk.sm8", [2.00, 2.01, 1.99, 2.0])
    runner = make_point("qkv-tp4-ub.te+dgrad.bulk.sm4", [2.10, 2.11, 2.09, 2.1])
    failed = make_point("qkv-tp4-ub.te+dgrad.bulk.sm16", status="failed")
    tp_ev = [{"rule": "hides_communication", "cases": ["qkv-tp2-none", "qkv-tp2-nocomm"], "passed": True}]
    comps = [{"a": {"case": "qkv-tp4-ub.te+dgrad.bulk.sm16", "median_ms": None}, "b": {"case": "qkv-tp4-none"}}]
    rec = decisions_record("qkv", tp=4, config={"qkv_dgrad": {"method": "bulk", "num_sm": 8}},
                           winner=win, runner_up=runner, tp_evidence=tp_ev, comparisons=comps)
    assert rec["tp"] == 4 and rec["winner"]["case"] == "qkv-tp4-ub.te+dgrad.bulk.sm8"
    assert rec["margin"] == 0.02
    assert rec["win_by"] == pytest.approx(0.1 / 2.1)
    assert rec["evidence_cases"] == sorted({"qkv-tp4-ub.te+dgrad.bulk.sm8", "qkv-tp4-ub.te+dgrad.bulk.sm4",
                                            "qkv-tp2-none", "qkv-tp2-nocomm",
                                            "qkv-tp4-ub.te+dgrad.bulk.sm16", "qkv-tp4-none"})
    rec2 = decisions_record("fc1", tp=1, config=None, winner=runner, runner_up=failed)
    assert rec2["runner_up"]["median_ms"] is None and rec2["win_by"] is None
    doc = json.loads(write_decisions_json(tmp_path / "decisions.json", [rec, rec2], {"model": "x"}).read_text())
    assert set(doc["ops"]) == {"qkv", "fc1"} and doc["meta"] == {"model": "x"}
