"""NVIDIA's userbuffers presets as shipped in config/presets, against the values in NeMo / Megatron-Bridge."""
from tptune.te.ubcfg import load_preset, te_default_ub_cfgs


def test_nvidia_bf16_tp2_is_nemos_b200_tp2_preset():
    """userbuffers_bf16_b200_h8192_tp2_mbs1_seqlen8192 (NeMo userbuffers.py, Megatron-Bridge comm_overlap.py)."""
    p = load_preset("nvidia_bf16_tp2")
    bulk = {"method": "bulk", "cga_size": 2, "set_sm_margin": 0}
    assert p["qkv_dgrad"] == {**bulk, "num_sm": 16} and p["qkv_wgrad"] == {**bulk, "num_sm": 24}
    assert p["fc1_dgrad"] == {**bulk, "num_sm": 2} and p["fc1_wgrad"] == {**bulk, "num_sm": 4}
    ring = {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": 0, "aggregate": 0, "use_ce": 1}
    for g in ("qkv_fprop", "proj_dgrad", "fc1_fprop", "fc2_dgrad"):
        assert p[g] == ring
    pipe = {"method": "pipeline", "cga_size": 2, "num_splits": 4, "set_sm_margin": 1}
    assert p["proj_fprop"] == {**pipe, "num_sm": 32} and p["fc2_fprop"] == {**pipe, "num_sm": 16}
    assert set(p) == set(te_default_ub_cfgs())


def test_nvidia_tp2_differs_from_the_tp4_preset_in_two_gemms():
    a, b = load_preset("nvidia_bf16_tp2"), load_preset("nemo_tp4")
    assert sorted(k for k in a if a[k] != b[k]) == ["proj_fprop", "qkv_dgrad"]


def test_launcher_h100_tp2_is_the_launchers_h100_tp2_file():
    """NeMo Framework Launcher's ub_cfg_h100_h8192_tp2_mbs1_seqlen4096: ring-exchange reduce-scatters and
    bulk 8/32/2/8 SMs."""
    p = load_preset("launcher_h100_tp2")
    bulk = {"method": "bulk", "cga_size": 2, "set_sm_margin": 0}
    assert [p[g] for g in ("qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad")] == \
        [{**bulk, "num_sm": n} for n in (8, 32, 2, 8)]
    ring = {"method": "ring_exchange", "num_sm": 1, "cga_size": 1, "set_sm_margin": 0, "aggregate": 0, "use_ce": 1}
    for g in ("qkv_fprop", "proj_dgrad", "fc1_fprop", "fc2_dgrad"):
        assert p[g] == ring
    for g in ("proj_fprop", "fc2_fprop"):
        assert p[g] == {**ring, "set_sm_margin": 1}
    assert set(p) == set(te_default_ub_cfgs())


def test_a_recipe_preset_is_its_base_with_the_layernorm_margins():
    """nemo_tp4_recipe / nvidia_bf16_tp2_recipe: the base preset's ub_cfgs as they are, and the layernorm SM
    margins NVIDIA's performance configs run them with, set by the worker while it builds the case."""
    from tptune.te.ubcfg import preset_environment

    for base in ("nemo_tp4", "nvidia_bf16_tp2"):
        assert load_preset(f"{base}_recipe") == load_preset(base)
        assert preset_environment(f"{base}_recipe") == {"NVTE_FWD_LAYERNORM_SM_MARGIN": "20",
                                                         "NVTE_BWD_LAYERNORM_SM_MARGIN": "20"}
        assert preset_environment(base) == {}
    assert preset_environment("te") == {}


def test_preset_base_and_environment_errors_name_the_file_and_field(tmp_path):
    import pytest
    from tptune.te.ubcfg import preset_environment

    (tmp_path / "loop_a.yaml").write_text("base: loop_b\n")
    (tmp_path / "loop_b.yaml").write_text("base: loop_a\n")
    (tmp_path / "conns.yaml").write_text("base: nemo_tp4\nenvironment: {CUDA_DEVICE_MAX_CONNECTIONS: 1}\n")
    (tmp_path / "neg.yaml").write_text("environment: {NVTE_FWD_LAYERNORM_SM_MARGIN: -4}\n")
    (tmp_path / "over.yaml").write_text("base: nemo_tp4\nproj_fprop: {method: ring_exchange}\n"
                                        "environment: {NVTE_BWD_LAYERNORM_SM_MARGIN: 8}\n")
    with pytest.raises(ValueError, match="base chain loops"):
        load_preset("loop_a", tmp_path)
    with pytest.raises(ValueError, match=r"conns.yaml: environment: CUDA_DEVICE_MAX_CONNECTIONS cannot differ"):
        preset_environment("conns", tmp_path)
    with pytest.raises(ValueError, match=r"neg.yaml: environment: NVTE_FWD_LAYERNORM_SM_MARGIN: expected a whole"):
        load_preset("neg", tmp_path)
    over = load_preset("over", tmp_path)     # the base's entries, the file's own on top
    assert over["proj_fprop"]["method"] == "ring_exchange" and over["qkv_dgrad"] == load_preset("nemo_tp4")["qkv_dgrad"]
    assert preset_environment("over", tmp_path) == {"NVTE_BWD_LAYERNORM_SM_MARGIN": "8"}
