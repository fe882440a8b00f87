"""FP8 userbuffers knobs (search.fp8): fp8_buf where TE honours it, atomic_gemm opt-in, recipe and
pairing rules, accepted and rejected configs; the NVIDIA FP8 presets pass."""
from __future__ import annotations

import pytest

from tptune.te.fp8 import check_no_fp8_knobs, strip_fp8_knobs, validate_fp8_ub_cfgs
from tptune.te.ubcfg import load_preset, te_default_ub_cfgs, validate_ub_cfgs

RE = {"method": "ring_exchange"}


def _cfg(**entries):
    cfgs = te_default_ub_cfgs()
    for k, v in entries.items():
        cfgs[k] = {**cfgs[k], **v}
    return cfgs


@pytest.mark.parametrize("cfgs,recipe,allow", [
    (te_default_ub_cfgs(), "delayed", False),
    (te_default_ub_cfgs(), "mxfp8", False),
    (_cfg(proj_fprop={"fp8_buf": 1}), "delayed", False),                       # pipeline RS: honoured
    (_cfg(fc2_fprop={"fp8_buf": True}), "current", False),
    (_cfg(proj_fprop={**RE, "fp8_buf": 1}), "delayed", False),                 # TE reads it for proj_fprop anyway
    (_cfg(proj_fprop={"fp8_buf": 0}), "mxfp8", False),
    (_cfg(qkv_fprop={"atomic_gemm": 1}, proj_fprop={**RE, "atomic_gemm": 1}), "delayed", True),   # the pair
    (_cfg(fc1_fprop={"atomic_gemm": 1}, fc2_fprop={**RE, "atomic_gemm": 1},
          proj_fprop={"atomic_gemm": 1}), "delayed", True),                  # atomic pipeline RS alone: fine
    (_cfg(qkv_fprop={"atomic_gemm": 0}), "current", False),
])
def test_accepted(cfgs, recipe, allow):
    validate_fp8_ub_cfgs(cfgs, recipe=recipe, allow_atomic=allow)


@pytest.mark.parametrize("cfgs,recipe,allow,match", [
    (_cfg(qkv_fprop={"fp8_buf": 1}), "delayed", False, r"qkv_fprop: fp8_buf: TE ignores it.*all-gather"),
    (_cfg(qkv_fprop={"fp8_buf": 0}), "delayed", False, r"qkv_fprop: fp8_buf: TE ignores it"),
    (_cfg(qkv_dgrad={"fp8_buf": 1}), "delayed", False, r"qkv_dgrad: fp8_buf: TE ignores it"),
    (_cfg(fc1_wgrad={"fp8_buf": 1}), "delayed", False, r"fc1_wgrad \(bulk\) never gets an FP8 buffer"),
    (_cfg(proj_dgrad={"fp8_buf": 1}), "current", False, r"proj_dgrad: fp8_buf"),
    (_cfg(proj_fprop={"fp8_buf": 1}), "mxfp8", False, r"per-tensor FP8 GEMM output"),
    (_cfg(qkv_fprop={"atomic_gemm": 1}, proj_fprop={**RE, "atomic_gemm": 1}), "delayed", False, r"opt-in"),
    (_cfg(qkv_fprop={"atomic_gemm": 1}, proj_fprop={**RE, "atomic_gemm": 1}), "current", True,
     r"delayed scaling"),
    (_cfg(qkv_wgrad={"atomic_gemm": 1}), "delayed", True, r"qkv_wgrad: atomic_gemm=1: TE ignores it for a bulk"),
    (_cfg(qkv_fprop={"atomic_gemm": 1}), "delayed", True,
     r"qkv_fprop uses atomic_gemm with ring_exchange but its pair proj_fprop does not: TE's atomic-GEMM pairing rule"),
    (_cfg(fc2_fprop={**RE, "atomic_gemm": 1}), "delayed", True,
     r"fc2_fprop uses atomic_gemm with ring_exchange but its pair fc1_fprop does not.*both fc1_fprop and fc2_fprop"),
    (_cfg(fc1_fprop={"atomic_gemm": 1}, fc2_fprop={"atomic_gemm": 1}), "delayed", True,
     r"fc1_fprop uses atomic_gemm with ring_exchange but its pair fc2_fprop does not"),   # fc2 pipeline
    (te_default_ub_cfgs(), "block", False, r"'block'.*cannot use userbuffers"),
    (te_default_ub_cfgs(), "nvfp4", False, r"cannot use userbuffers"),
    (_cfg(proj_fprop={"fp8_buf": 2}), "delayed", False, r"expected true/false"),
    ({}, "e5m2", False, r"unknown FP8 recipe"),
])
def test_rejected(cfgs, recipe, allow, match):
    with pytest.raises(ValueError, match=match):
        validate_fp8_ub_cfgs(cfgs, recipe=recipe, allow_atomic=allow)


def test_partial_config_missing_pair_member_counts_as_not_atomic():
    with pytest.raises(ValueError, match="pairing rule"):
        validate_fp8_ub_cfgs({"qkv_fprop": {**RE, "atomic_gemm": True}}, recipe="delayed", allow_atomic=True)


def test_non_fp8_runs_refuse_fp8_knobs():
    with pytest.raises(ValueError, match="Atomic GEMM overlap supported only for FP8"):
        check_no_fp8_knobs(_cfg(qkv_fprop={"atomic_gemm": 1}), "bf16")
    with pytest.raises(ValueError, match="fp8_buf=1 applies to FP8 runs only"):
        check_no_fp8_knobs(_cfg(proj_fprop={"fp8_buf": 1}), "bf16")
    check_no_fp8_knobs(_cfg(proj_fprop={"fp8_buf": 0}), "bf16")


def test_strip_then_bf16_rules_then_fp8_rules():
    cfgs = _cfg(proj_fprop={"fp8_buf": 1}, qkv_fprop={"atomic_gemm": 0})
    with pytest.raises(ValueError, match="needs an FP8 workload"):  # ubcfg knows the FP8 knobs: FP8 only
        validate_ub_cfgs(cfgs)
    validate_ub_cfgs(strip_fp8_knobs(cfgs))
    validate_fp8_ub_cfgs(cfgs, recipe="delayed", allow_atomic=False)


@pytest.mark.parametrize("name", ["nvidia_fp8_tp4", "nvidia_fp8_tp2"])
def test_nvidia_fp8_presets(name):
    cfgs = load_preset(name)
    assert cfgs["proj_fprop"]["method"] == cfgs["fc2_fprop"]["method"] == "ring_exchange"
    assert cfgs["proj_fprop"]["set_sm_margin"] == 1 and cfgs["proj_fprop"]["cga_size"] == 1
    assert cfgs["qkv_dgrad"] == {"method": "bulk", "num_sm": 4, "cga_size": 2, "set_sm_margin": 0}
    for recipe in ("delayed", "current", "mxfp8"):
        validate_fp8_ub_cfgs(cfgs, recipe=recipe, allow_atomic=False)
