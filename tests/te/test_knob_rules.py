"""TE 2.20 initialize_ub's rules for every knob (ubcfg.validate_ub_cfgs): accepted where TE honours
the knob, refused with TE's reason where TE refuses or ignores it."""
import pytest

from tptune.cases import parse_case_id
from tptune.te.ubcfg import case_ub_cfgs, te_default_ub_cfgs, validate_ub_cfgs

PIPE = {"method": "pipeline", "num_sm": 16, "cga_size": 2, "set_sm_margin": 1, "num_splits": 4}
RING = {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": 0, "aggregate": 0, "use_ce": 1}
BULK = {"method": "bulk", "num_sm": 16, "cga_size": 2, "set_sm_margin": 1}


def full(**entries):
    c = te_default_ub_cfgs()
    c.update(entries)
    return c


@pytest.mark.parametrize("cfg, workload", [
    ({"proj_fprop": {**PIPE, "pipeline_rs_overlap_first_gemm": 1}}, "bf16"),
    ({"proj_fprop": {**PIPE, "comm_priority": -5, "gemm_priority": -5}}, "bf16"),
    ({"qkv_wgrad": {**BULK, "comm_priority": -1}}, "bf16"),
    ({"qkv_fprop": {**RING, "gemm_priority": -3}}, "bf16"),
    ({"fc2_fprop": {**PIPE, "fp8_buf": 1}}, "fp8"),
    ({"proj_fprop": {**RING, "fp8_buf": 1}}, "fp8"),            # TE honours it at proj/fc2 fprop
    ({"fc2_fprop": {**PIPE, "atomic_gemm": 1}}, "fp8"),         # atomic pipelined RS, no pairing
    ({"proj_dgrad": {**RING, "atomic_gemm": 1}}, "fp8"),        # not in an AG-RS pair
    ({"qkv_fprop": {**RING, "fp8_buf": 1}}, "fp8"),             # the value TE forces anyway
    ({"qkv_fprop": {**RING, "atomic_gemm": 0, "fp8_buf": 0}}, "bf16"),
    ({"proj_fprop": {**PIPE, "is_reduce_scatter": True}}, "bf16"),
    ({"qkv_dgrad": {"method": "ring_exchange"}}, "bf16"),        # RS dgrad, no qkv_wgrad given
    ({"fc1_dgrad": {**PIPE, "fp8_buf": 1}}, "fp8"),             # pipelined RS dgrad honours fp8_buf
])
def test_accepted_where_te_honours_the_knob(cfg, workload):
    validate_ub_cfgs(cfg, require_all=False, workload=workload)


@pytest.mark.parametrize("cfg, workload, match", [
    ({"qkv_fprop": {**RING, "pipeline_rs_overlap_first_gemm": 1}}, "bf16", "split_overlap_rs"),
    ({"qkv_dgrad": {**BULK, "pipeline_rs_overlap_first_gemm": 1}}, "bf16", "split_overlap_rs"),
    ({"proj_fprop": {**RING, "num_splits": 4}}, "bf16", "tp_size chunks"),
    ({"fc1_wgrad": {**BULK, "use_ce": 0}}, "bf16", "use_ce=false"),
    ({"proj_fprop": {**PIPE, "aggregate": 1}}, "bf16", "split_overlap_ag"),
    ({"proj_fprop": {**PIPE, "comm_priority": -6}}, "bf16", r"comm_priority=-6 out of range \[-5, 0\]"),
    ({"proj_fprop": {**PIPE, "gemm_priority": 1}}, "bf16", "gemm_priority"),
    ({"proj_fprop": {**PIPE, "comm_priority": 0}}, "bf16", "device's range"),
    ({"proj_fprop": {**PIPE, "comm_priority": 0, "gemm_priority": 0}}, "bf16", "device's range"),
    ({"proj_fprop": {**PIPE, "atomic_gemm": 1}}, "bf16", "supported only for FP8 GEMM"),
    ({"proj_fprop": {**PIPE, "fp8_buf": 1}}, "bf16", "only under FP8"),
    ({"qkv_dgrad": {**BULK, "atomic_gemm": 1}}, "fp8", "not is supported for a bulk overlap"),
    ({"qkv_fprop": {**RING, "fp8_buf": 0}}, "fp8", "forces fp8_buf=True"),
    ({"fc1_wgrad": {**BULK, "fp8_buf": 1}}, "fp8", "forces fp8_buf=False"),
    ({"qkv_dgrad": {"method": "ring_exchange"}, "qkv_wgrad": BULK}, "bf16",
     "Cannot specify user UB config for 'qkv_wgrad'"),
    ({"qkv_dgrad": {"method": "ring_exchange", "fp8_buf": 1}}, "fp8", "only with method pipeline"),
    ({"proj_fprop": {**PIPE, "is_reduce_scatter": False}}, "bf16", "TE sets it to True"),
    ({"proj_wgrad": {"method": "external"}}, "bf16", "external"),
    ({"proj_fprop": PIPE}, "int4", "workload"),
])
def test_refused_with_tes_reason(cfg, workload, match):
    with pytest.raises(ValueError, match=match):
        validate_ub_cfgs(cfg, require_all=False, workload=workload)


def test_atomic_ring_exchange_pairs():
    qkv = {**RING, "atomic_gemm": 1}
    proj = {**RING, "atomic_gemm": 1}
    validate_ub_cfgs(full(qkv_fprop=qkv, proj_fprop=proj), workload="fp8")
    with pytest.raises(ValueError, match="qkv_fprop uses atomic GEMM with ring_exchange but proj_fprop"):
        validate_ub_cfgs(full(qkv_fprop=qkv), workload="fp8")
    with pytest.raises(ValueError, match="fc2_fprop uses atomic GEMM with ring_exchange but fc1_fprop"):
        validate_ub_cfgs(full(fc2_fprop={**RING, "atomic_gemm": 1}), workload="fp8")
    # an atomic *pipelined* proj_fprop is not part of the ring pair rule
    validate_ub_cfgs(full(proj_fprop={**PIPE, "atomic_gemm": 1}), workload="fp8")
    # a partial config checks a pair only when both halves are given
    validate_ub_cfgs({"qkv_fprop": qkv}, require_all=False, workload="fp8")


def test_reduce_scatter_dgrad_config_need_not_list_its_wgrad():
    c = full(fc1_dgrad={"method": "pipeline", "num_sm": 8, "cga_size": 2, "set_sm_margin": 1, "num_splits": 4})
    del c["fc1_wgrad"]
    validate_ub_cfgs(c)
    del c["qkv_wgrad"]
    with pytest.raises(ValueError, match="missing GEMM"):
        validate_ub_cfgs(c)


def test_new_knobs_round_trip_through_case_ids():
    cid = "proj-tp2-ub.te+fprop.pipe.sm8.rsfirst1.cprio5.gprio1+dgrad.ring.ce0"
    c = parse_case_id(cid)
    assert c.id == cid
    cfg = case_ub_cfgs(c)
    assert cfg["proj_fprop"]["comm_priority"] == -5 and cfg["proj_fprop"]["gemm_priority"] == -1
    assert cfg["proj_fprop"]["pipeline_rs_overlap_first_gemm"] == 1
    f8 = case_ub_cfgs(parse_case_id("fc2-tp2-ub.te+fprop.pipe.fbuf1"), workload="fp8")
    assert f8["fc2_fprop"]["fp8_buf"] == 1
    with pytest.raises(ValueError, match="FP8"):
        case_ub_cfgs(parse_case_id("fc2-tp2-ub.te+fprop.pipe.fbuf1"))
