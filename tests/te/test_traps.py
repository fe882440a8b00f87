"""Traps (tptune.te.traps): each fires on a config that has it and stays silent on one that does not;
`tptune validate` prints them and refuses the errors."""
import subprocess
import sys

import pytest
import yaml

from tptune.errors import ConfigError
from tptune.model.spec import load_model, parse_model
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import load_config_files
from tptune.te.traps import model_traps

from conftest import FIXTURES, ROOT

HF = FIXTURES / "hf"
ALL = ("qkv", "proj", "fc1", "fc2")


def codes(mc, ops=ALL, tps=(2, 4), **kw):
    return {t.code for t in model_traps(mc, ops, tps, **kw)}


def hf(name, **wl):
    return load_model(HF / f"{name}.config.json", {"seq_length": 4096, **wl})


def test_silent_on_a_plain_dense_model():
    assert codes(hf("llama-3.1-8b")) == set()
    assert codes(hf("qwen1.5-moe-a2.7b")) == set()       # shared experts: fc1/fc2 have a shape under overlap


def test_mla_and_mtp_name_what_really_overlaps():
    t = {x.code: x for x in model_traps(hf("deepseek-v3"), ("proj", "fc1", "fc2"), (2, 4))}
    assert set(t) == {"mla_buffer_names", "mtp_buffer_name"}
    assert "linear_q_down_proj" in t["mla_buffer_names"].text and "at most layer 1's linear_proj" in t["mla_buffer_names"].text
    assert "shared expert in 58 layer(s)" in t["mla_buffer_names"].text
    assert "decoder's 61 layers (built before) keep overlap" in t["mtp_buffer_name"].text
    lite = codes(hf("deepseek-v2-lite"), ("proj",))
    assert lite == {"mla_buffer_names"}                   # no MTP there


def test_ops_without_overlap_are_errors():
    t = model_traps(hf("deepseek-v3"), ALL, (2,))
    assert t[0].level == "error" and t[0].code == "ops_without_overlap" and "op qkv" in t[0].text
    mix = [x for x in model_traps(hf("mixtral-8x7b-v0.1"), ALL, (2,)) if x.level == "error"]
    assert [x.text.split(":")[0] for x in mix] == ["op fc1", "op fc2"]
    assert "(this model's TP-overlap ops: qkv, proj; or leave 'ops' out" in mix[0].todo
    assert codes(hf("mixtral-8x7b-v0.1"), ("qkv", "proj")) == set()


def test_shared_expert_overlap_tp1_sp_packed_and_te_version():
    base = {"hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8, "num_layers": 4,
            "num_moe_experts": 4, "moe_router_topk": 2, "moe_ffn_hidden_size": 256,
            "moe_shared_expert_intermediate_size": 512, "workload": {"seq_length": 64}}
    assert codes(parse_model(base)) == set()
    t = model_traps(parse_model(dict(base, moe_shared_expert_overlap=True)), ALL, (2,))
    assert [x.code for x in t] == ["shared_expert_overlap"] and "no fc1/fc2 of this model" in t[0].text
    assert codes(parse_model(base), tps=(1, 2)) == {"tp1"}
    assert codes(parse_model(dict(base, workload={"seq_length": 64, "sequence_parallel": False}))) == {"sequence_parallel_off"}
    assert codes(parse_model(dict(base, sequence_parallel=False))) == {"sequence_parallel_off"}
    packed = model_traps(parse_model(dict(base, workload={"seq_length": 64, "packed_sequences": True})), ALL, (2,))
    assert [x.code for x in packed] == ["packed_sequences"] and "pad every micro-batch to seq_length=64" in packed[0].todo
    mc = parse_model(base)
    assert codes(mc, knobs_used={"comm_priority"}, te_version=(2, 8)) == {"te_version"}
    assert codes(mc, knobs_used={"comm_priority"}, te_version=(2, 20)) == set()
    assert codes(mc, knobs_used={"num_sm"}, te_version=(2, 8)) == set()
    assert codes(mc, knobs_used={"comm_priority"}, te_version=None) == set()


def _run_cfg(tmp_path, model, **over):
    cfg = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    cfg.update(model=str(model), backend="torch", **over)
    p = tmp_path / "run.yaml"
    p.write_text(yaml.safe_dump(cfg))
    return p


def test_resolve_refuses_ops_without_overlap(tmp_path):
    cfg = load_config_files(_run_cfg(tmp_path, HF / "mixtral-8x7b-v0.1.config.json", ops=list(ALL),
                                     workload={"seq_length": 4096}))
    with pytest.raises(ConfigError) as e:
        resolve_here(cfg, check_hardware=False)
    assert "field 'ops': op fc1: nothing to tune in" in str(e.value)
    assert "remove fc1 from 'ops'" in str(e.value) and "op qkv" not in str(e.value)


@pytest.mark.parametrize("model,ops,left_out", [
    ("mixtral-8x7b-v0.1", ["qkv", "proj"], "fc1, fc2"),
    ("qwen3-30b-a3b", ["qkv", "proj"], "fc1, fc2"),
    ("deepseek-v3", ["proj", "fc1", "fc2"], "qkv"),
    ("llama-3.1-8b", list(ALL), None),
])
def test_default_ops_adapt_to_the_model(tmp_path, model, ops, left_out):
    """A run file without 'ops' (the defaults' ops: auto) tunes the model's TP-overlap ops and says which
    it left out and why; config.json keeps "auto", so every step re-resolves the same ops. Was: an MoE
    model was refused ("remove fc1 from 'ops'") for the defaults' [qkv, proj, fc1, fc2]."""
    from tptune.settings.resolve import load_run_config

    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({"model": str(HF / f"{model}.config.json"), "backend": "torch",
                                   "workload": {"seq_length": 4096}, "parallel": {"memory_check": False}}))
    cfg, source, base = load_run_config([run])
    s = resolve_here(cfg, source=source, base_dir=base, check_hardware=False)
    assert s.ops == ops and cfg["ops"] == "auto"
    assert s.ops_note.startswith(f"ops: {', '.join(ops)}: the default (ops: auto)")
    if left_out:
        assert f"it leaves out {left_out}: " in s.ops_note
    else:
        assert "leaves out" not in s.ops_note
    out = subprocess.run([sys.executable, "-m", "tptune", "validate", str(run)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1] == s.ops_note


def test_ops_given_are_not_adapted(tmp_path):
    """Only 'ops' as written is refused, and only the ops outside TP overlap; a valid list stays as given."""
    cfg = load_config_files(_run_cfg(tmp_path, HF / "qwen3-30b-a3b.config.json", ops=["qkv", "fc2"],
                                     workload={"seq_length": 4096}, parallel={"memory_check": False}))
    with pytest.raises(ConfigError) as e:
        resolve_here(cfg, check_hardware=False)
    assert "remove fc2 from 'ops'" in str(e.value) and "remove fc1" not in str(e.value)
    cfg["ops"] = ["proj"]
    s = resolve_here(cfg, check_hardware=False)
    assert s.ops == ["proj"] and s.ops_note is None


def test_validate_prints_traps(tmp_path):
    p = _run_cfg(tmp_path, HF / "deepseek-v3.config.json", ops=["proj", "fc1", "fc2"],
                 workload={"seq_length": 4096, "packed_sequences": True},
                 parallel={"memory_check": False})
    out = subprocess.run([sys.executable, "-m", "tptune", "validate", str(p)], capture_output=True, text=True,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("ok: ")
    assert {ln.split("]")[0] for ln in lines[1:] if ln.startswith("warning [")} == {
        "warning [mla_buffer_names", "warning [mtp_buffer_name", "warning [packed_sequences", "warning [mla_layer_stage"}
    # validate on this CPU host also says what the CPU path is for (issue 54 item 9), on its own line
    assert [ln for ln in lines[1:] if not ln.startswith("warning [")][0].startswith("tptune: the CPU path")


def test_mla_layer_stage_is_named_where_the_block_would_run():
    from tptune.te.traps import run_traps

    cfg = {"ops": ["proj", "fc1", "fc2"], "tp_sizes": [2]}
    assert "mla_layer_stage" in {t.code for t in run_traps(cfg, hf("deepseek-v3"), te_version=None)}
    off = {t.code for t in run_traps({**cfg, "layer": {"enabled": False}}, hf("deepseek-v3"), te_version=None)}
    assert "mla_layer_stage" not in off
    assert "mla_layer_stage" not in {t.code for t in run_traps(cfg, hf("llama-3.1-70b"), te_version=None)}
