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
    with pytest.raises(ConfigError, match=r"field 'timing.iters': matches none of its forms \('ten' is not of type 'integer'; 'ten' is not one of \['auto'\]\)"):
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


def test_backend_dependent_defaults(pool_dir):
    """config/config.yaml's auto fields: te gets the proven knob search and budget, torch the CPU default's
    values; a value the run config gives is kept; op_settings resolve the same way; config.json records the
    resolved values and backend (settings.backend_defaults.recorded), so a record replays as measured."""
    from conftest import ROOT
    from tptune.settings import backend_defaults
    from tptune.settings.resolve import load_config_files

    defaults = load_config_files(ROOT / "config" / "config.yaml")
    assert backend_defaults.auto_fields(defaults) == ["search.mode", "timing.warmup", "timing.iters",
                                                      "timing.min_rounds", "decision.explore_all_tps",
                                                      "launcher.idle_timeout_s", "confirm.enabled",
                                                      "search.te_presets"]
    cpu = resolve_here(dict(defaults, launcher={**defaults["launcher"], "pool_dir": str(pool_dir)}))
    assert cpu.backend == "torch" and cpu.search.mode == "bisect" and cpu.search.te_presets == ["nemo_tp4"]
    assert (cpu.timing.warmup, cpu.timing.iters, cpu.timing.min_rounds, cpu.timing.max_rounds) == (2, 5, 3, 4)
    assert cpu.decision.explore_all_tps is False and cpu.launcher.idle_timeout_s == 30
    assert cpu.confirm.enabled is False

    te_cfg = dict(defaults, backend="te", hardware={"gpu_memory_gb": 79.1},
                  model=str(ROOT / "config" / "models" / "llama3-70b.yaml"), tp_sizes=[2, 4],
                  op_settings={"fc2": {"timing": {"min_rounds": "auto", "max_rounds": 6}}})
    te = resolve_here(te_cfg, check_hardware=False)
    assert te.search.mode == "knobs" and te.search.te_presets == ["nemo_tp4", "nvidia_bf16_tp2"]
    assert (te.timing.warmup, te.timing.iters, te.timing.min_rounds, te.timing.max_rounds) == (3, 10, 2, 4)
    assert te.decision.explore_all_tps is True and te.launcher.idle_timeout_s == 300
    assert te.confirm.enabled is True
    assert (te.op("fc2").timing.min_rounds, te.op("fc2").timing.max_rounds) == (2, 6)
    own = resolve_here(dict(te_cfg, search={**defaults["search"], "mode": "bisect"},
                            timing={**defaults["timing"], "min_rounds": 3}), check_hardware=False)
    assert own.search.mode == "bisect" and own.timing.min_rounds == 3 and own.timing.iters == 10
    fp8 = resolve_here(dict(te_cfg, workload={"dtype": "fp8", "recipe": "delayed"}, hardware={"gpu": "H100",
                                                                                              "gpu_memory_gb": 79.1}),
                       check_hardware=False)
    assert fp8.search.te_presets == ["nvidia_fp8_tp4", "nvidia_fp8_tp2"]

    rec = backend_defaults.recorded(te_cfg, "te")
    assert rec["backend"] == "te" and backend_defaults.auto_fields(rec) == []
    # the knob groups searched are recorded too: a later default (tptune/data/knob_groups.json) leaves the
    # record's search as measured
    from tptune.te.methods import PROVEN_GROUPS
    assert rec["search"]["knobs"] == {"groups": list(PROVEN_GROUPS)}
    replayed = resolve_here(rec, check_hardware=False).search.as_dict()
    assert replayed.pop("knobs") == {"groups": list(PROVEN_GROUPS)}
    assert replayed == {k: v for k, v in te.search.as_dict().items() if k != "knobs"}
    mine = backend_defaults.recorded(dict(te_cfg, search={**defaults["search"], "knobs": {"groups": "all"}}), "te")
    assert mine["search"]["knobs"] == {"groups": "all"}
    assert backend_defaults.recorded(defaults, "torch")["backend"] == "torch"
