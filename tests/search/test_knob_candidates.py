"""Candidate values per knob group (methods.py) and the freeze-or-bisect planner (knobs.py) on
synthetic measurements."""
import math

import pytest

from tptune.cases import parse_case_id
from tptune.records.measured_point import MeasuredPoint
from tptune.search.knobs import plan_next, plan_result, setting_case
from tptune.te.methods import (atomic_pair_candidates, gemm_knob_values, grid_size, knob_candidates, knob_config, te_candidates)
from tptune.te.ubcfg import case_ub_cfgs, load_preset, te_default_ub_cfgs, validate_ub_cfgs

ROUND_FACTORS = [1.0, 1.012, 0.991, 1.004]       # drift shared by every member of a session
ALL = {"groups": "all"}                          # every knob group TE honours (the default: the proven ones)


def test_default_groups_are_the_proven_ones_and_all_is_every_group():
    from tptune.te.methods import ALL_GROUPS, PROVEN_GROUPS
    # the default: the groups search.knob_rule keeps over the committed runs (tptune/data/knob_groups.json)
    assert knob_config()["groups"] == list(PROVEN_GROUPS) == ["method", "rs_dgrad", "num_sm"]
    assert knob_config(ALL)["groups"] == list(ALL_GROUPS)
    assert knob_config({"groups": "proven"})["groups"] == list(PROVEN_GROUPS)
    c = knob_candidates("proj", 2, load_preset("nvidia_bf16_tp2"))
    assert set(c) == {"method", "num_sm"}                           # proj: no rs_dgrad
    with pytest.raises(ValueError, match="knobs.groups: 'some' is not one of proven, all"):
        knob_config({"groups": "some"})
    with pytest.raises(ValueError, match="knobs.groups: expected proven, all or a non-empty list"):
        knob_config({"groups": []})


def test_candidates_per_group_cheapest_first_and_only_where_te_reads_them():
    base = load_preset("nvidia_bf16_tp2")
    c = knob_candidates("proj", 2, base, config=ALL)
    assert c["method"] == {"proj_fprop": ["ring_exchange", "pipeline"]}
    assert c["num_sm"]["proj_fprop"] == [1, 2, 4, 8, 16, 24, 32]
    assert c["num_splits"] == {"proj_fprop": [2, 4, 8]}
    assert c["cga_size"] == {"proj_fprop": [1, 2, 4]}
    assert c["use_ce"] == {"proj_dgrad": [1, 0]}
    assert c["aggregate"] == {"proj_dgrad": [0, 1]}                # AG ring only
    assert "proj_dgrad" not in c["num_sm"]                         # CE ring, no margin: unused
    assert "fp8_buf" not in c                                      # bf16
    assert c["priority"]["proj_fprop"][0] == (-5, 0)               # TE's default first
    q = knob_candidates("qkv", 2, base, config=ALL)
    assert "num_splits" not in q and "method" not in q             # bulk/ring: no splits, one method
    assert set(q["num_sm"]) == {"qkv_dgrad", "qkv_wgrad"}
    f8 = knob_candidates("fc2", 2, base, config=ALL, workload="fp8")
    assert f8["fp8_buf"] == {"fc2_fprop": [0, 1]}
    assert f8["pipeline_rs_overlap_first_gemm"] == {"fc2_fprop": [0, 1]}


def test_every_candidate_is_a_valid_config_and_a_case_that_reproduces_it():
    base = load_preset("nvidia_bf16_tp2")
    from tptune.te.methods import with_knob
    for op in ("qkv", "proj", "fc1", "fc2"):
        for group, per in knob_candidates(op, 2, base, config=ALL, workload="fp8").items():
            for name, vals in per.items():
                for v in vals:
                    cfgs = with_knob(base, name, group, v)
                    validate_ub_cfgs(cfgs, workload="fp8")
                    got = case_ub_cfgs(parse_case_id(setting_case(op, 2, cfgs)), workload="fp8")
                    assert got[name] == cfgs[name]


def test_num_sm_of_a_ring_exchange_counts_only_with_sm_copies_or_a_margin():
    e = {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": 0, "use_ce": 1}
    assert gemm_knob_values("qkv_fprop", e, "num_sm") == []
    assert gemm_knob_values("qkv_fprop", {**e, "use_ce": 0}, "num_sm")[0] == 1
    assert gemm_knob_values("qkv_fprop", {**e, "set_sm_margin": 1}, "num_sm")
    assert gemm_knob_values("proj_fprop", e, "aggregate") == []    # RS ring ignores aggregate
    b = {"method": "bulk", "num_sm": 6, "cga_size": 2, "set_sm_margin": 0}
    assert gemm_knob_values("qkv_dgrad", b, "cga_size") == [1, 2]  # 4 does not divide 6


def test_knob_config_rejections():
    with pytest.raises(ValueError, match="knobs.num_sm"):
        knob_config({"num_sm": [0, 4]})
    with pytest.raises(ValueError, match="knobs.priority"):
        knob_config({"priority": [[0, 0]]})
    with pytest.raises(ValueError, match="unknown key"):
        knob_config({"sms": [1]})
    with pytest.raises(ValueError, match="knobs.groups"):
        knob_config({"groups": ["nope"]})


def test_atomic_pairs_are_block_candidates_under_fp8_only():
    base = te_default_ub_cfgs()
    assert atomic_pair_candidates(base) == []
    c = atomic_pair_candidates(base, "fp8")
    assert len(c) == 3 and c[1]["qkv_fprop"]["atomic_gemm"] == 1 and c[1]["proj_fprop"]["method"] == "ring_exchange"


def test_te_candidates_unchanged():
    plans = te_candidates("qkv", 2)
    assert [p.method for p in plans["dgrad"]] == ["bulk"] and plans["dgrad"][0].sm_candidates


# ---- the planner on synthetic measurements ----

def _time(op, cfgs, model):
    return model({k: v for k, v in cfgs.items() if k.startswith(op + "_")})


def _measure_all(op, tp, refs, model, config=None, workload="bf16", limit=400):
    measured = {}
    for _ in range(limit):
        s = plan_next(op, tp, refs, measured, config, workload=workload)
        if s is None:
            return plan_result(op, tp, refs, measured, config, workload=workload), measured
        pts = {}
        for cid in s.members:
            t = _time(op, case_ub_cfgs(parse_case_id(cid), workload=workload), model)
            pts[cid] = MeasuredPoint.from_dict({"case": cid, "status": "ok", "session": s.label, "timing": {
                "total_ms": {"median": t, "rounds": [t * f for f in ROUND_FACTORS], "round_ids": [0, 1, 2, 3]}}})
        measured[s.label] = pts
    raise AssertionError("search did not finish")


def _refs():
    return {"te": te_default_ub_cfgs(), "nvidia_bf16_tp2": load_preset("nvidia_bf16_tp2")}


def proj_model(c):
    """proj: pipeline fprop, unimodal in num_sm (best 8) and num_splits (best 4); nothing else moves."""
    f, d = c["proj_fprop"], c["proj_dgrad"]
    t = 10.0
    if f["method"] == "pipeline":
        t -= 1.0
        t += 0.5 * abs(math.log2(f["num_sm"]) - 3) ** 2 + 0.5 * abs(math.log2(f["num_splits"]) - 2) ** 2
    return t + 0.0 * d["use_ce"]


def test_planner_freezes_what_does_not_matter_and_bisects_to_the_minimum():
    res, measured = _measure_all("proj", 2, _refs(), proj_model, config=ALL)
    f = res.cfgs["proj_fprop"]
    assert f["method"] == "pipeline" and f["num_sm"] == 8 and f["num_splits"] == 4
    assert f["cga_size"] == 1 and f["set_sm_margin"] == 0                  # no effect: cheapest
    assert f.get("pipeline_rs_overlap_first_gemm", 0) == 0
    assert res.cfgs["proj_dgrad"]["use_ce"] == 1 and res.cfgs["proj_dgrad"]["aggregate"] == 0
    assert (f.get("comm_priority", -5), f.get("gemm_priority", 0)) == (-5, 0)
    best_ref = min(proj_model({k: v for k, v in r.items() if k.startswith("proj_")}) for r in _refs().values())
    assert proj_model(res.cfgs) <= best_ref
    # affordable: far fewer measurements than the exhaustive grid of the same knobs
    assert res.measurements < 0.25 * grid_size("proj", 2, load_preset("nvidia_bf16_tp2"), config=ALL)
    assert res.measurements < 60


def test_planner_never_worse_than_the_best_reference():
    # every knob change makes things slower: the answer is the best reference, unchanged
    ref = load_preset("nvidia_bf16_tp2")
    def model(c):
        return 5.0 + sum(0.5 for k, e in c.items() if e != ref[k])
    res, _ = _measure_all("fc2", 2, _refs(), model)
    assert res.reference == "nvidia_bf16_tp2"
    assert model({k: v for k, v in res.cfgs.items() if k.startswith("fc2_")}) == 5.0


def test_joint_search_of_the_two_bulk_gemms():
    # qkv bulk pair: the best is dgrad 4 SMs + wgrad 16 SMs, with an interaction term
    def model(c):
        d, w = c["qkv_dgrad"]["num_sm"], c["qkv_wgrad"]["num_sm"]
        return 8.0 + 0.2 * (math.log2(d) - 2) ** 2 + 0.2 * (math.log2(w) - 4) ** 2 + (0.3 if d + w > 24 else 0)
    res, measured = _measure_all("qkv", 2, _refs(), model,
                                 config={"groups": ["num_sm"]})
    assert (res.cfgs["qkv_dgrad"]["num_sm"], res.cfgs["qkv_wgrad"]["num_sm"]) == (4, 16)
    assert any(":confirm" in label and "qkv_dgrad+qkv_wgrad" in label for label in measured)


def test_plan_result_before_the_end_and_stale_sessions():
    with pytest.raises(ValueError, match="not finished"):
        plan_result("proj", 2, _refs(), {})
    s = plan_next("proj", 2, _refs(), {})
    assert s.label == "refs" and len(s.members) == 2
    # a session whose members changed is asked again
    assert plan_next("proj", 2, _refs(), {"refs": {"x": {}}}).label == "refs"


# ---- the reduce-scatter dgrad (Megatron's tp_comm_overlap_rs_dgrad) ----

def test_rs_dgrad_is_a_column_dgrad_choice_that_drops_the_wgrad():
    base = load_preset("nvidia_bf16_tp2")
    c = knob_candidates("qkv", 2, base)
    assert c["rs_dgrad"] == {"qkv_dgrad": [0, 1]}
    assert "rs_dgrad" not in knob_candidates("proj", 2, base)
    assert "rs_dgrad" not in knob_candidates("qkv", 2, base, config={"rs_dgrad": [0]})
    from tptune.te.methods import with_knob
    rs = with_knob(base, "fc1_dgrad", "rs_dgrad", 1)
    assert rs["fc1_dgrad"]["method"] == "ring_exchange" and "fc1_wgrad" not in rs
    got = case_ub_cfgs(parse_case_id(setting_case("fc1", 2, rs)))      # the op's entries reproduce
    assert {k: v for k, v in got.items() if k.startswith("fc1_")} == {k: v for k, v in rs.items() if k.startswith("fc1_")}
    back = with_knob(rs, "fc1_dgrad", "rs_dgrad", 0)
    assert back["fc1_dgrad"]["method"] == "bulk" and back["fc1_wgrad"] == te_default_ub_cfgs()["fc1_wgrad"]
    with pytest.raises(ValueError, match="knobs.rs_dgrad"):
        knob_config({"rs_dgrad": [2]})
    # the grid counts the reduce-scatter mode beside the bulk one
    assert grid_size("qkv", 2, base) > grid_size("qkv", 2, base, config={"rs_dgrad": [0]})


def _rs_model(gain):
    """qkv: a ring-exchange reduce-scatter dgrad is ``gain`` ms faster than any bulk pair; within it
    use_ce 0 costs 0.5 ms; bulk num_sm does not matter."""
    def model(c):
        d = c["qkv_dgrad"]
        if d["method"] == "ring_exchange":
            return 8.0 - gain + (0.5 if not d["use_ce"] else 0.0)
        return 8.0
    return model


def test_planner_takes_the_rs_dgrad_when_it_wins_and_keeps_the_bulk_alternative():
    res, measured = _measure_all("qkv", 2, _refs(), _rs_model(0.6), config=ALL)
    assert res.cfgs["qkv_dgrad"]["method"] == "ring_exchange" and "qkv_wgrad" not in res.cfgs
    assert res.cfgs["qkv_dgrad"]["use_ce"] == 1
    assert "use_ce:qkv_dgrad" in measured                        # the chosen mode's knobs are searched
    assert not any("qkv_wgrad" in label for label in measured)   # the dropped wgrad is not
    alt = case_ub_cfgs(parse_case_id(res.alternative))
    assert alt["qkv_dgrad"]["method"] == "bulk" and "qkv_wgrad" in alt


def test_planner_keeps_bulk_on_a_tie_and_offers_the_rs_dgrad_as_alternative():
    res, _ = _measure_all("qkv", 2, _refs(), _rs_model(0.05))      # < the 2% margin of 8 ms
    assert res.cfgs["qkv_dgrad"]["method"] == "bulk" and "qkv_wgrad" in res.cfgs
    assert case_ub_cfgs(parse_case_id(res.alternative))["qkv_dgrad"]["method"] == "ring_exchange"
    res, _ = _measure_all("proj", 2, _refs(), proj_model)
    assert res.alternative is None
