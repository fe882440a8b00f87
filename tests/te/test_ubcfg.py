import pytest

from tptune.cases import parse_case_id
from tptune.model.ops import TE_GEMMS
from tptune.te.ubcfg import (case_ub_cfgs, compose_ub_cfgs, load_preset, te_default_ub_cfgs, validate_ub_cfgs)


def test_te_defaults_cover_ten_gemms_with_te_methods():
    d = te_default_ub_cfgs()
    assert list(d) == list(TE_GEMMS) and len(d) == 10
    for name in ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad"):
        assert d[name] == {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": 0,
                           "aggregate": 0, "use_ce": 1}
    for name in ("proj_fprop", "fc2_fprop"):
        assert d[name] == {"method": "pipeline", "num_sm": 16, "cga_size": 2, "set_sm_margin": 1,
                           "num_splits": 4}
    for name in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad"):
        assert d[name] == {"method": "bulk", "num_sm": 16, "cga_size": 2, "set_sm_margin": 1}
    validate_ub_cfgs(d)


def test_nemo_preset_file():
    n = load_preset("nemo_tp4")
    assert n["qkv_wgrad"] == {"method": "bulk", "num_sm": 24, "cga_size": 2, "set_sm_margin": 0}
    assert n["fc1_dgrad"]["num_sm"] == 2
    assert n["proj_fprop"] == {"method": "pipeline", "num_sm": 24, "cga_size": 2, "set_sm_margin": 1,
                               "num_splits": 4}
    assert n["fc2_dgrad"] == te_default_ub_cfgs()["fc2_dgrad"]     # unlisted knobs: TE defaults


def test_override_with_same_method_keeps_preset_knobs():
    cfg = case_ub_cfgs(parse_case_id("qkv-tp4-ub.nemo_tp4+dgrad.bulk.sm8"))
    assert cfg["qkv_dgrad"] == {"method": "bulk", "num_sm": 8, "cga_size": 2, "set_sm_margin": 0}
    assert cfg["qkv_wgrad"] == load_preset("nemo_tp4")["qkv_wgrad"]
    assert {k: v for k, v in cfg.items() if k != "qkv_dgrad"} == \
        {k: v for k, v in load_preset("nemo_tp4").items() if k != "qkv_dgrad"}


def test_override_changing_method_starts_from_that_methods_defaults():
    cfg = case_ub_cfgs(parse_case_id("proj-tp4-ub.nemo_tp4+fprop.ring"))
    assert cfg["proj_fprop"] == {"method": "ring_exchange", "num_sm": 1, "cga_size": 1,
                                 "set_sm_margin": 0, "aggregate": 0, "use_ce": 1}
    cfg = case_ub_cfgs(parse_case_id("fc2-tp2-ub.te+fprop.ring.agg1"))
    assert cfg["fc2_fprop"]["aggregate"] == 1 and "num_splits" not in cfg["fc2_fprop"]


def test_a_reduce_scatter_dgrad_drops_the_default_wgrad_as_te_does(tmp_path):
    cfg = case_ub_cfgs(parse_case_id("fc1-tp2-ub.nvidia_bf16_tp2+dgrad.pipe.sm8"))
    assert "fc1_wgrad" not in cfg and cfg["fc1_dgrad"]["method"] == "pipeline"
    assert cfg["qkv_wgrad"] == load_preset("nvidia_bf16_tp2")["qkv_wgrad"]     # the other op keeps its bulk
    # a user file making both column dgrads reduce-scatters loads; one that also gives a wgrad is refused
    (tmp_path / "rs.yaml").write_text("qkv_dgrad: {method: ring_exchange}\nfc1_dgrad: {method: pipeline, num_sm: 8}\n")
    cfg = load_preset("rs", tmp_path)
    assert "qkv_wgrad" not in cfg and "fc1_wgrad" not in cfg and len(cfg) == 8
    (tmp_path / "bad.yaml").write_text("qkv_dgrad: {method: ring_exchange}\nqkv_wgrad: {method: bulk}\n")
    with pytest.raises(ValueError, match="Cannot specify user UB config for 'qkv_wgrad'"):
        load_preset("bad", tmp_path)


@pytest.mark.parametrize("case_id, key", [
    ("qkv-tp4-ub.te+fprop.pipe", "qkv_fprop"),        # pipeline cannot all-gather
    ("proj-tp4-ub.te+fprop.bulk", "proj_fprop"),      # bulk only for qkv/fc1 dgrad/wgrad
    ("fc1-tp4-ub.te+dgrad.ring+wgrad.bulk.sm4", "fc1_wgrad"),   # TE: no wgrad config beside an RS dgrad
    ("fc2-tp4-ub.te+dgrad.ring.split4", "fc2_dgrad"),  # ring_exchange ignores num_splits
    ("qkv-tp4-ub.te+wgrad.bulk.sm200", "qkv_wgrad"),
    ("qkv-tp4-ub.te+wgrad.bulk.sm0", "qkv_wgrad"),
    ("fc1-tp4-ub.te+wgrad.bulk.ce1", "fc1_wgrad"),     # bulk has no use_ce
])
def test_invalid_overrides_name_the_key(case_id, key):
    with pytest.raises(ValueError, match=key):
        case_ub_cfgs(parse_case_id(case_id))


@pytest.mark.parametrize("bad, key", [
    ({"qkv_xgrad": {"method": "bulk"}}, "qkv_xgrad"),
    ({"qkv_fprop": {"num_sm": 1}}, "qkv_fprop"),
    ({"qkv_fprop": {"method": "ring"}}, "qkv_fprop"),
    ({"qkv_dgrad": {"method": "bulk", "atomic_gemm": 1}}, "atomic_gemm"),
    ({"qkv_dgrad": {"method": "bulk", "cga_size": 9}}, "cga_size"),
    ({"qkv_dgrad": {"method": "bulk", "set_sm_margin": 2}}, "set_sm_margin"),
    ({"qkv_dgrad": {"method": "bulk", "num_sm": "8"}}, "num_sm"),
])
def test_validation_errors(bad, key):
    with pytest.raises(ValueError, match=key):
        validate_ub_cfgs(bad, require_all=False)


def test_validation_requires_all_ten_unless_told():
    partial = {"qkv_fprop": te_default_ub_cfgs()["qkv_fprop"]}
    validate_ub_cfgs(partial, require_all=False)
    with pytest.raises(ValueError, match="missing GEMM"):
        validate_ub_cfgs(partial)


def test_preset_from_a_directory_and_bad_presets(tmp_path):
    (tmp_path / "mine.yaml").write_text("fc1_wgrad: {method: bulk, num_sm: 8, set_sm_margin: false}\n")
    cfg = case_ub_cfgs(parse_case_id("fc1-tp2-ub.mine"), presets_dir=tmp_path)
    assert cfg["fc1_wgrad"] == {"method": "bulk", "num_sm": 8, "cga_size": 2, "set_sm_margin": 0}
    (tmp_path / "broken.yaml").write_text("proj_fprop: {method: bulk}\n")
    with pytest.raises(ValueError, match="proj_fprop"):
        load_preset("broken", tmp_path)
    with pytest.raises(ValueError, match="no file"):
        load_preset("absent", tmp_path)


def test_only_ub_cases_have_ub_cfgs():
    with pytest.raises(ValueError, match="only ub"):
        case_ub_cfgs(parse_case_id("qkv-tp2-chunked.n4"))


def test_compose_takes_each_ops_own_gemms():
    qkv = case_ub_cfgs(parse_case_id("qkv-tp4-ub.te+dgrad.bulk.sm4"))
    fc2 = case_ub_cfgs(parse_case_id("fc2-tp4-ub.te+fprop.ring"))
    fc2["qkv_dgrad"] = {"method": "bulk", "num_sm": 32}          # not fc2's: must be ignored
    out = compose_ub_cfgs({"qkv": qkv, "fc2": fc2})
    assert out["qkv_dgrad"]["num_sm"] == 4
    assert out["fc2_fprop"]["method"] == "ring_exchange"
    assert out["proj_fprop"] == te_default_ub_cfgs()["proj_fprop"]
