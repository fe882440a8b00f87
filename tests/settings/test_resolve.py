import pytest

from tptune.errors import ConfigError
from tptune.measure.preflight import resolve_here

from conftest import base_config


def test_default_config_resolves_to_cpu_torch(pool_dir):
    s = resolve_here(base_config(pool_dir))
    assert s.backend == "torch" and s.device == "cpu" and s.run == "tiny-s512-b1-fp32-torch"


def test_unknown_op_and_bad_tp_named(pool_dir):
    cfg = base_config(pool_dir, ops=["qkv", "mlp"])
    with pytest.raises(ConfigError, match=r"field 'ops.1': 'mlp' is not one of"):
        resolve_here(cfg)
    cfg = base_config(pool_dir, tp_sizes=[2, 3, 16])
    with pytest.raises(ConfigError) as e:
        resolve_here(cfg)
    msg = str(e.value)
    assert "TP=3 is not a power of two" in msg and "TP=16 exceeds gpus_per_node=8" in msg
    assert "TP=16: num_attention_heads=8 is not divisible by 16" in msg


def test_heads_not_divisible_by_tp(pool_dir):
    with pytest.raises(ConfigError, match="TP=8: num_query_groups=4 is not divisible by 8"):
        resolve_here(base_config(pool_dir, tp_sizes=[2, 8]))


def test_op_settings_merge_and_validation(pool_dir):
    s = resolve_here(base_config(pool_dir, op_settings={"fc1": {"timing": {"iters": 7}}}))
    assert s.op("fc1").timing.iters == 7
    assert s.op("qkv").timing.iters == 3
    with pytest.raises(ConfigError, match="op_settings.mlp': unknown op"):
        resolve_here(base_config(pool_dir, op_settings={"mlp": {}}))


def test_te_backend_without_gpu_is_refused(pool_dir):
    with pytest.raises(ConfigError, match="te needs CUDA GPUs"):
        resolve_here(base_config(pool_dir, backend="te"))


def test_schema_types(pool_dir):
    with pytest.raises(ConfigError, match=r"field 'timing.iters': 'ten' is not of type 'integer'"):
        resolve_here(base_config(pool_dir, timing={"iters": "ten"}))
    with pytest.raises(ConfigError, match=r"field 'search.bogus': unknown key"):
        resolve_here(base_config(pool_dir, search={"bogus": 1}))


def test_gpu_overlay_merges_over_the_x2_config():
    """config/gpu/no-layer.yaml over the x2 config, as scripts/device_workflow.sh passes it (EXTRA_CONFIG)."""
    from conftest import ROOT
    from tptune.settings.resolve import load_config_files

    cfg = load_config_files(*(ROOT / p for p in ("config/config.yaml", "config/gpu/h200x2-llama3-70b.yaml",
                                                 "config/gpu/no-layer.yaml")))
    s = resolve_here(cfg, base_dir=ROOT, check_hardware=False)
    t = s.timing
    assert (t.window_ms, t.preroll_ms, t.max_rounds, t.futility) == (500, 150, 6, True)
    assert s.layer.enabled is False
