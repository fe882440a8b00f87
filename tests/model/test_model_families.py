"""The families of issue 29, read from their public config.json (tests/fixtures/hf): every field
tptune needs, and the shape of every linear op under TP overlap, against the public values."""
import json

import pytest

from tptune.errors import ConfigError
from tptune.model.spec import load_model, parse_model
from tptune.model.ops import layer_linears, op_shapes, primary_shape

from conftest import FIXTURES

HF = FIXTURES / "hf"
# name: (hidden, heads, kv heads, head dim, dense MLP width, activation, qkv bias, layers, vocab,
#        experts, top-k, expert width, shared width, dense layers, MoE layers, MLA, MTP)
PUBLIC = {
    "llama-3.1-8b": (4096, 32, 8, 128, 14336, "silu", None, 32, 128256, None, None, None, None, 32, 0, False, None),
    "llama-3.1-70b": (8192, 64, 8, 128, 28672, "silu", None, 80, 128256, None, None, None, None, 80, 0, False, None),
    "llama-3.1-405b": (16384, 128, 8, 128, 53248, "silu", None, 126, 128256, None, None, None, None, 126, 0, False, None),
    "llama-3.2-1b": (2048, 32, 8, 64, 8192, "silu", None, 16, 128256, None, None, None, None, 16, 0, False, None),
    "llama-3.2-3b": (3072, 24, 8, 128, 8192, "silu", None, 28, 128256, None, None, None, None, 28, 0, False, None),
    "llama-4-scout-17b-16e": (5120, 40, 8, 128, 16384, "silu", None, 48, 202048, 16, 1, 8192, 8192, 0, 48, False, None),
    "llama-4-maverick-17b-128e": (5120, 40, 8, 128, 16384, "silu", None, 48, 202048, 128, 1, 8192, 8192, 24, 24, False, None),
    "qwen2.5-7b": (3584, 28, 4, 128, 18944, "silu", True, 28, 152064, None, None, None, None, 28, 0, False, None),
    "qwen2.5-32b": (5120, 40, 8, 128, 27648, "silu", True, 64, 152064, None, None, None, None, 64, 0, False, None),
    "qwen3-0.6b": (1024, 16, 8, 128, 3072, "silu", None, 28, 151936, None, None, None, None, 28, 0, False, None),
    "qwen3-8b": (4096, 32, 8, 128, 12288, "silu", None, 36, 151936, None, None, None, None, 36, 0, False, None),
    "qwen3-32b": (5120, 64, 8, 128, 25600, "silu", None, 64, 151936, None, None, None, None, 64, 0, False, None),
    "qwen3-30b-a3b": (2048, 32, 4, 128, 6144, "silu", None, 48, 151936, 128, 8, 768, None, 0, 48, False, None),
    "qwen3-235b-a22b": (4096, 64, 4, 128, 12288, "silu", None, 94, 151936, 128, 8, 1536, None, 0, 94, False, None),
    "qwen1.5-moe-a2.7b": (2048, 16, 16, 128, 5632, "silu", True, 24, 151936, 60, 4, 1408, 5632, 0, 24, False, None),
    "mistral-7b-v0.3": (4096, 32, 8, 128, 14336, "silu", None, 32, 32768, None, None, None, None, 32, 0, False, None),
    "mistral-nemo-base-2407": (5120, 32, 8, 128, 14336, "silu", None, 40, 131072, None, None, None, None, 40, 0, False, None),
    "mixtral-8x7b-v0.1": (4096, 32, 8, 128, 14336, "silu", None, 32, 32000, 8, 2, 14336, None, 0, 32, False, None),
    "mixtral-8x22b-v0.1": (6144, 48, 8, 128, 16384, "silu", None, 56, 32768, 8, 2, 16384, None, 0, 56, False, None),
    "gemma-2-9b": (3584, 16, 8, 256, 14336, "gelu_tanh", None, 42, 256000, None, None, None, None, 42, 0, False, None),
    "gemma-2-27b": (4608, 32, 16, 128, 36864, "gelu_tanh", None, 46, 256000, None, None, None, None, 46, 0, False, None),
    "gemma-3-1b": (1152, 4, 1, 256, 6912, "gelu_tanh", None, 26, 262144, None, None, None, None, 26, 0, False, None),
    "gemma-3-27b": (5376, 32, 16, 128, 21504, "gelu_tanh", None, 62, 262208, None, None, None, None, 62, 0, False, None),
    "phi-3-mini-4k-instruct": (3072, 32, 32, 96, 8192, "silu", None, 32, 32064, None, None, None, None, 32, 0, False, None),
    "phi-4": (5120, 40, 10, 128, 17920, "silu", None, 40, 100352, None, None, None, None, 40, 0, False, None),
    "gpt-oss-20b": (2880, 64, 8, 64, 2880, "silu", True, 24, 201088, 32, 4, 2880, None, 0, 24, False, None),
    "gpt-oss-120b": (2880, 64, 8, 64, 2880, "silu", True, 36, 201088, 128, 4, 2880, None, 0, 36, False, None),
    "deepseek-v3": (7168, 128, 128, 128, 18432, "silu", None, 61, 129280, 256, 8, 2048, 2048, 3, 58, True, 1),
    "deepseek-v2-lite": (2048, 16, 16, 128, 10944, "silu", None, 27, 102400, 64, 6, 1408, 2816, 1, 26, True, None),
}
# The ops' shapes under TP overlap, [in, out] of the full weight, and in how many layers: (qkv, proj, fc1, fc2)
SHAPES = {
    "llama-3.1-8b": ([(4096, 6144, 32)], [(4096, 4096, 32)], [(4096, 28672, 32)], [(14336, 4096, 32)]),
    "llama-3.2-1b": ([(2048, 3072, 16)], [(2048, 2048, 16)], [(2048, 16384, 16)], [(8192, 2048, 16)]),
    "llama-4-scout-17b-16e": ([(5120, 7168, 48)], [(5120, 5120, 48)], [(5120, 16384, 48)], [(8192, 5120, 48)]),
    "llama-4-maverick-17b-128e": ([(5120, 7168, 48)], [(5120, 5120, 48)], [(5120, 32768, 24), (5120, 16384, 24)],
                                  [(16384, 5120, 24), (8192, 5120, 24)]),
    "qwen3-32b": ([(5120, 10240, 64)], [(8192, 5120, 64)], [(5120, 51200, 64)], [(25600, 5120, 64)]),
    "qwen3-30b-a3b": ([(2048, 5120, 48)], [(4096, 2048, 48)], [], []),
    "qwen1.5-moe-a2.7b": ([(2048, 6144, 24)], [(2048, 2048, 24)], [(2048, 11264, 24)], [(5632, 2048, 24)]),
    "mistral-nemo-base-2407": ([(5120, 6144, 40)], [(4096, 5120, 40)], [(5120, 28672, 40)], [(14336, 5120, 40)]),
    "mixtral-8x7b-v0.1": ([(4096, 6144, 32)], [(4096, 4096, 32)], [], []),
    "gemma-2-9b": ([(3584, 8192, 42)], [(4096, 3584, 42)], [(3584, 28672, 42)], [(14336, 3584, 42)]),
    "gemma-3-27b": ([(5376, 8192, 62)], [(4096, 5376, 62)], [(5376, 43008, 62)], [(21504, 5376, 62)]),
    "phi-4": ([(5120, 7680, 40)], [(5120, 5120, 40)], [(5120, 35840, 40)], [(17920, 5120, 40)]),
    "gpt-oss-20b": ([(2880, 5120, 24)], [(4096, 2880, 24)], [], []),
    "deepseek-v3": ([], [(16384, 7168, 61)], [(7168, 36864, 3), (7168, 4096, 58)], [(18432, 7168, 3), (2048, 7168, 58)]),
}


def load(name):
    return load_model(HF / f"{name}.config.json", {"seq_length": 4096})


def test_every_fixture_is_in_the_table():
    assert {p.name.removesuffix(".config.json") for p in HF.glob("*.config.json")} == set(PUBLIC)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_fields_read_exactly(name):
    m = load(name).model
    (h, heads, kvh, hd, ffn, act, qkv_bias, layers, vocab, experts, topk, moe_w, shared, dense, moe, mla, mtp) = PUBLIC[name]
    assert (m.hidden_size, m.num_attention_heads, m.num_query_groups, m.kv_channels) == (h, heads, kvh, hd)
    assert (m.ffn_hidden_size, m.gated_mlp, m.activation_name, m.add_qkv_bias) == (ffn, True, act, qkv_bias)
    assert (m.num_layers, m.vocab_size) == (layers, vocab)
    assert (m.num_moe_experts, m.moe_router_topk, m.moe_ffn_hidden_size) == (experts, topk, moe_w)
    assert (m.moe_shared_expert_intermediate_size, m.dense_layers, m.moe_layers) == (shared, dense, moe)
    assert (m.is_mla, m.mtp_num_layers) == (mla, mtp)
    # the spec survives the worker's round trip (ModelConfig.to_dict -> parse_model)
    d = load(name).to_dict()
    assert parse_model(d["model"] | {"workload": d["workload"]}, d["source"]).model == m


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_op_shapes_against_public_values(name):
    mc = load(name)
    got = tuple([(s.k_in, s.n_out, s.layers) for s in op_shapes(op, mc)] for op in ("qkv", "proj", "fc1", "fc2"))
    assert got == SHAPES[name]


def test_linears_outside_overlap_are_named():
    lin = {x.module: x for x in layer_linears(load("deepseek-v3"))}
    assert lin["self_attention.linear_q_down_proj"].k_in == 7168 and lin["self_attention.linear_q_down_proj"].n_out == 1536
    assert (lin["self_attention.linear_q_up_proj"].k_in, lin["self_attention.linear_q_up_proj"].n_out) == (1536, 128 * 192)
    assert (lin["self_attention.linear_kv_down_proj"].n_out, lin["self_attention.linear_kv_up_proj"].n_out) == (576, 128 * 256)
    routed = lin["mlp.experts.linear_fc1 (routed)"]
    assert (routed.k_in, routed.n_out, routed.per_layer, routed.layers, routed.overlap) == (7168, 4096, 256, 58, False)
    assert lin["mlp.router"].n_out == 256 and not lin["mlp.router"].overlap
    assert lin["mlp.shared_experts.linear_fc1"].overlap and lin["mlp.shared_experts.linear_fc1"].op == "fc1"
    assert lin["mtp.layers.eh_proj"].k_in == 2 * 7168
    assert "self_attention.linear_q_proj" in {x.module for x in layer_linears(load("deepseek-v2-lite"))}
    with pytest.raises(ValueError, match="multi-latent attention has no linear_qkv"):
        primary_shape("qkv", load("deepseek-v3"))
    with pytest.raises(ValueError, match="routed experts, which never run under TP comm overlap"):
        primary_shape("fc1", load("mixtral-8x7b-v0.1"))
    assert primary_shape("fc1", load("deepseek-v3")).what == "shared expert"   # 58 layers against 3


def test_gated_by_family_not_by_activation_name():
    """Gemma's gelu_pytorch_tanh MLP is gated (gate_proj/up_proj); StarCoder2's is not."""
    g = json.loads((HF / "gemma-2-9b.config.json").read_text())
    assert parse_model(g, "g.json", {"seq_length": 64}).model.fc1_out == 2 * 14336
    sc = {"model_type": "starcoder2", "hidden_size": 3072, "intermediate_size": 12288, "num_attention_heads": 24,
          "num_key_value_heads": 2, "hidden_act": "gelu_pytorch_tanh", "use_bias": True}
    m = parse_model(sc, "sc.json", {"seq_length": 64}).model
    assert not m.gated_mlp and m.fc1_out == 12288 and m.add_bias_linear and m.activation_name == "gelu_tanh"


@pytest.mark.parametrize("raw, needle", [
    ({"model_type": "minicpm3", "hidden_size": 2560, "intermediate_size": 6400, "num_attention_heads": 40,
      "q_lora_rank": 768, "kv_lora_rank": 256}, "field 'model_type' 'minicpm3' is not a family tptune reads"),
    ({"hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32}, "field 'model_type' missing"),
    ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "kv_lora_rank": 512}, "field 'kv_lora_rank': multi-latent attention in a 'llama' config"),
    ({"model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_experts": 8}, "field 'num_experts' = 8: experts in a 'qwen3' config"),
    ({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "attention_bias": True}, "add_bias_linear is one switch"),
    ({"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_hidden_layers": 2, "num_local_experts": 8}, "missing field 'num_experts_per_tok'"),
    ({"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432, "num_attention_heads": 128,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128},
     "missing field 'q_lora_rank'"),
    ({"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_attention_heads": 16,
      "hidden_activation": "swooshy"}, "field 'hidden_activation' = 'swooshy'"),
])
def test_refused_naming_the_field(raw, needle):
    with pytest.raises(ConfigError) as e:
        parse_model(raw, "config.json", {"seq_length": 64})
    assert needle in str(e.value)


def test_mla_without_experts_is_a_dense_mla_model():
    raw = json.loads((HF / "deepseek-v3.config.json").read_text())
    raw.pop("n_routed_experts")
    m = parse_model(raw, "c.json", {"seq_length": 64}).model
    assert m.is_mla and not m.is_moe and m.dense_layers == 61
    assert [(s.k_in, s.n_out) for s in op_shapes("fc1", parse_model(raw, "c.json", {"seq_length": 64}))] == [(7168, 36864)]


# --- Megatron-style model files: unknown keys refused with the nearest name (issue 27) -------------------
BASE = {"hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8, "num_query_groups": 2,
        "workload": {"seq_length": 64}}


@pytest.mark.parametrize("key, value, near", [
    ("num_query_gropus", 4, "num_query_groups"),
    ("swiglo", True, "swiglu"),
    ("hiden_size", 512, "hidden_size"),
    ("num_moe_expert", 8, "num_moe_experts"),
])
def test_megatron_unknown_key_refused_with_nearest(key, value, near):
    with pytest.raises(ConfigError) as e:
        parse_model(dict(BASE, **{key: value}), "m.yaml")
    assert f"unknown field '{key}' (did you mean '{near}'?)" in str(e.value)


def test_megatron_activation_and_moe_read():
    m = parse_model(dict(BASE, activation="swiglu"), "m.yaml").model
    assert m.gated_mlp and m.activation_name == "silu"
    assert parse_model(dict(BASE, activation="geglu"), "m.yaml").model.activation_name == "gelu"
    with pytest.raises(ConfigError, match="'activation' = 'swishy'"):
        parse_model(dict(BASE, activation="swishy"), "m.yaml")
    moe = parse_model(dict(BASE, num_layers=4, num_moe_experts=8, moe_router_topk=2, moe_ffn_hidden_size=256,
                           moe_shared_expert_intermediate_size=512, moe_layer_freq="([0]*1+[1]*3)"), "m.yaml").model
    assert (moe.dense_layers, moe.moe_layers, moe.moe_pattern()) == (1, 3, [False, True, True, True])
    assert parse_model(dict(BASE, num_layers=4, num_moe_experts=8, moe_router_topk=2, moe_layer_freq=2),
                       "m.yaml").model.moe_pattern() == [True, False, True, False]
    with pytest.raises(ConfigError, match="an MoE field, but num_moe_experts is not set"):
        parse_model(dict(BASE, moe_router_topk=2), "m.yaml")
    with pytest.raises(ConfigError, match="'moe_layer_freq': 3 entries for num_layers=4"):
        parse_model(dict(BASE, num_layers=4, num_moe_experts=8, moe_router_topk=2, moe_layer_freq=[0, 1, 1]), "m.yaml")
    # NeMo nesting: its model block has keys of its own; only near-misses of ours are refused
    nemo = {"trainer": {"devices": 8}, "model": dict(BASE, optim={"name": "adam"}, tokenizer={"library": "x"})}
    assert parse_model(nemo, "nemo.yaml").model.num_query_groups == 2
    with pytest.raises(ConfigError, match="did you mean 'num_query_groups'"):
        parse_model({"model": dict(BASE, num_query_gropus=4)}, "nemo.yaml")
