import json
from dataclasses import replace

import pytest

from tptune.errors import ConfigError
from tptune.model.spec import load_model, parse_model

from conftest import ROOT

LLAMA3_70B_HF = {  # meta-llama/Meta-Llama-3-70B config.json (the fields that matter + noise)
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_attention_heads": 64, "num_key_value_heads": 8,
    "num_hidden_layers": 80, "hidden_act": "silu", "max_position_embeddings": 8192,
    "rope_theta": 500000.0, "torch_dtype": "bfloat16", "vocab_size": 128256, "tie_word_embeddings": False,
}


def test_presets_have_public_shapes():
    m = load_model(ROOT / "config/models/llama3-70b.yaml")
    assert (m.model.hidden_size, m.model.ffn_hidden_size, m.model.num_attention_heads,
            m.model.num_query_groups, m.model.kv_channels, m.model.gated_mlp) == (8192, 28672, 64, 8, 128, True)
    assert m.model.qkv_out == 8192 + 2 * 8 * 128 and m.model.fc1_out == 2 * 28672
    q = load_model(ROOT / "config/models/qwen2.5-72b.yaml")
    assert q.model.ffn_hidden_size == 29568
    e = load_model(ROOT / "config/models/llama3-8b.yaml")
    assert (e.model.hidden_size, e.model.ffn_hidden_size, e.model.num_attention_heads) == (4096, 14336, 32)
    assert load_model(ROOT / "config/models/tiny.yaml").workload.dtype == "fp32"


def test_hf_config_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps(LLAMA3_70B_HF))
    m = load_model(p, {"seq_length": 8192})
    assert m.model == load_model(ROOT / "config/models/llama3-70b.yaml").model.__class__(
        m.model.name, 8192, 28672, 64, 8, 128, True, 80, 128256, True)
    assert m.model == replace(load_model(ROOT / "config/models/llama3-70b.yaml").model, name=m.model.name)
    assert m.workload.dtype == "bf16" and m.workload.tokens == 8192
    assert m.model.kv_channels == 128  # derived: hidden / heads


def test_hf_explicit_head_dim_and_gated_by_family():
    """Mistral's MLP is gate/up/down whatever hidden_act says: gelu makes it GeGLU, not ungated."""
    raw = dict(LLAMA3_70B_HF, head_dim=96, hidden_act="gelu", model_type="mistral")
    m = parse_model(raw, "x.json", {"seq_length": 1024})
    assert m.model.kv_channels == 96 and m.model.gated_mlp and m.model.activation_name == "gelu"
    ungated = parse_model(dict(raw, model_type="gpt_neox", attention_bias=True), "x.json", {"seq_length": 1024})
    assert not ungated.model.gated_mlp and ungated.model.add_bias_linear


def test_megatron_nemo_nesting_and_swiglu():
    raw = {"model": {"hidden_size": 1024, "ffn_hidden_size": 4096, "num_attention_heads": 16,
                     "num_query_groups": 4, "gated_linear_unit": True, "seq_length": 2048, "bf16": True}}
    m = parse_model(raw, "nemo.yaml")
    assert m.model.gated_mlp and m.model.kv_channels == 64 and m.workload.seq_length == 2048


def test_missing_and_mistyped_fields_are_named_together():
    with pytest.raises(ConfigError) as e:
        parse_model({"hidden_size": "4096", "num_attention_heads": 32, "workload": {"seq_length": 0}}, "bad.yaml")
    msg = str(e.value)
    assert "bad.yaml" in msg
    assert "'hidden_size' = '4096': expected a positive integer, got str" in msg
    assert "missing field 'ffn_hidden_size'" in msg
    assert "'seq_length' = 0" in msg


def test_inconsistent_groups_and_bad_dtype():
    with pytest.raises(ConfigError) as e:
        parse_model({"hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8,
                     "num_query_groups": 3, "workload": {"seq_length": 64, "dtype": "int8"}}, "m.yaml")
    assert "num_query_groups' = 3: must divide num_attention_heads=8" in str(e.value)
    assert "'dtype' = 'int8'" in str(e.value)


def test_tp_problems_per_size():
    m = parse_model({"hidden_size": 768, "ffn_hidden_size": 3072, "num_attention_heads": 12,
                     "num_query_groups": 12, "workload": {"seq_length": 1020}}, "m.yaml")
    assert m.tp_problems(2) == []
    p8 = m.tp_problems(8)
    assert any("num_attention_heads=12 is not divisible by 8" in p for p in p8)
    assert any("tokens" in p and "1020" in p for p in p8)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_model(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("hidden_size: [1, 2\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_model(bad)


def test_memory_fields_and_round_trip_through_to_dict():
    """The worker rebuilds the model from ModelConfig.to_dict() (worker/server.py): same spec back."""
    m = parse_model(LLAMA3_70B_HF, "config.json", {"seq_length": 8192})
    assert (m.model.num_layers, m.model.vocab_size, m.model.untie_embeddings_and_output_weights) == (80, 128256, True)
    d = m.to_dict()
    back = parse_model(d["model"] | {"workload": d["workload"]}, d["source"])
    assert back == m and back.model == m.model
    # optional fields absent: None, and left out of the dict (such a file's dict is as before)
    optional = ("num_hidden_layers", "vocab_size", "tie_word_embeddings")
    bare = parse_model({k: v for k, v in LLAMA3_70B_HF.items() if k not in optional}, "c.json", {"seq_length": 64})
    assert (bare.model.num_layers, bare.model.vocab_size, bare.model.untie_embeddings_and_output_weights) == (None,) * 3
    assert not {"num_layers", "vocab_size", "untie_embeddings_and_output_weights"} & set(bare.to_dict()["model"])
    d = bare.to_dict()
    assert parse_model(d["model"] | {"workload": d["workload"]}, d["source"]).model == bare.model


def test_tied_embedding_names():
    base = {"hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8, "num_layers": 2,
            "vocab_size": 1000, "workload": {"seq_length": 64}}
    assert parse_model(dict(base, untie_embeddings_and_output_weights=True)).model.untie_embeddings_and_output_weights
    assert parse_model(dict(base, share_embeddings_and_output_weights=False)).model.untie_embeddings_and_output_weights
    assert parse_model(dict(base, tie_word_embeddings=True)).model.untie_embeddings_and_output_weights is False
    with pytest.raises(ConfigError, match="contradict each other"):
        parse_model(dict(base, tie_word_embeddings=True, untie_embeddings_and_output_weights=True))
    with pytest.raises(ConfigError, match="'num_layers' = 0: expected a positive integer"):
        parse_model(dict(base, num_layers=0))


def test_mixture_of_experts_configs_are_read(tmp_path):
    """MoE configs were refused; now read (tests/model/test_model_families.py has every family)."""
    raw = {"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
           "num_hidden_layers": 32, "vocab_size": 32000, "hidden_act": "silu", "intermediate_size": 14336,
           "num_local_experts": 8, "num_experts_per_tok": 2}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    m = load_model(p, {"seq_length": 4096}).model
    assert (m.num_moe_experts, m.moe_router_topk, m.moe_ffn_hidden_size, m.moe_layers) == (8, 2, 14336, 32)


def test_megatron_moe_fields_and_zero_experts_is_dense():
    base = {"hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8, "workload": {"seq_length": 64}}
    with pytest.raises(ConfigError, match="missing field 'moe_router_topk'"):
        parse_model(dict(base, num_moe_experts=8))
    assert parse_model(dict(base, num_moe_experts=8, moe_router_topk=2)).model.moe_ffn_hidden_size == 1024
    assert parse_model(dict(base, num_moe_experts=None, num_experts=0)).model.ffn_hidden_size == 1024
