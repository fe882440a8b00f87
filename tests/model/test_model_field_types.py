"""Every field a model file is read by has its type checked (issue 54 item 5): before, `num_moe_experts: "8"`
or `8.0` was read as a dense model, a Hugging Face `use_bias: "false"` as true, and a string where a list of
layers goes was a traceback. Each is refused naming the field and the type expected, in both formats, with
the file's other problems."""
import json

import pytest
import yaml

from tptune.errors import ConfigError
from tptune.model.spec import load_model

TINY_MOE = {"hidden_size": 512, "ffn_hidden_size": 1536, "num_attention_heads": 8, "num_query_groups": 4,
            "num_layers": 4, "num_moe_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 256,
            "workload": {"seq_length": 512}}
MIXTRAL = {"model_type": "mixtral", "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
           "num_key_value_heads": 4, "num_hidden_layers": 4, "num_local_experts": 8, "num_experts_per_tok": 2}
LLAMA = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
         "num_key_value_heads": 4, "num_hidden_layers": 4}
DEEPSEEK = {"model_type": "deepseek_v3", "hidden_size": 512, "intermediate_size": 1536, "num_attention_heads": 8,
            "num_hidden_layers": 4, "q_lora_rank": None, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 16, "v_head_dim": 32, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 256, "n_shared_experts": 1, "first_k_dense_replace": 1}


def _load(tmp_path, raw, hf):
    f = tmp_path / ("config.json" if hf else "model.yaml")
    f.write_text(json.dumps(raw) if hf else yaml.safe_dump(raw))
    return load_model(f, {"seq_length": 512} if hf else None), str(f)


def _refused(tmp_path, raw, hf, *expect):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, raw, hf)
    msg = str(e.value)
    for text in expect:
        assert text in msg, msg
    return msg


def test_the_files_as_given_are_read_as_moe(tmp_path):
    assert _load(tmp_path, TINY_MOE, False)[0].model.num_moe_experts == 8
    assert _load(tmp_path, MIXTRAL, True)[0].model.num_moe_experts == 8
    assert _load(tmp_path, DEEPSEEK, True)[0].model.moe_shared_expert_intermediate_size == 256


@pytest.mark.parametrize("value", ["8", 8.0])
def test_expert_counts_of_the_wrong_type_are_never_read_as_dense(tmp_path, value):
    _refused(tmp_path, dict(TINY_MOE, num_moe_experts=value), False,
             f"field 'num_moe_experts' = {value!r}: expected an integer, got {type(value).__name__}")
    # an alias of it, and a dense Hugging Face family given experts of the wrong type
    raw = {k: v for k, v in TINY_MOE.items() if k != "num_moe_experts"}
    _refused(tmp_path, dict(raw, num_experts=value), False, "field 'num_experts'", "expected an integer")
    _refused(tmp_path, dict(LLAMA, num_local_experts=value), True, "field 'num_local_experts'", "expected an integer")


def test_the_file_is_named_and_its_other_problems_kept(tmp_path):
    """No cascade: the MoE fields beside a mistyped expert count are not called fields of a dense model."""
    msg = _refused(tmp_path, dict(TINY_MOE, num_moe_experts="8", num_attention_heads=None, vocab_size=1.5), False,
                   "model.yaml", "field 'num_moe_experts'", "missing field 'num_attention_heads'",
                   "field 'vocab_size' = 1.5: expected a positive integer, got float")
    assert "num_moe_experts is not set" not in msg, msg


@pytest.mark.parametrize("raw, hf, expect", [
    (dict(LLAMA, model_type="starcoder2", use_bias="false"), True, "field 'use_bias' = 'false': expected true or false, got str"),
    (dict(LLAMA, model_type="gpt_neox", attention_bias="no"), True, "field 'attention_bias' = 'no': expected true or false"),
    (dict(DEEPSEEK, first_k_dense_replace="1"), True, "field 'first_k_dense_replace' = '1': expected an integer"),
    (dict(DEEPSEEK, n_shared_experts=1.5), True, "field 'n_shared_experts' = 1.5: expected an integer, got float"),
    (dict(DEEPSEEK, moe_layer_freq="2"), True, "field 'moe_layer_freq' = '2': expected a positive integer"),
    (dict(MIXTRAL, model_type="qwen3_moe", moe_intermediate_size=256, mlp_only_layers="0,1"), True,
     "field 'mlp_only_layers' = '0,1': expected a list of integers"),
    (dict(MIXTRAL, model_type="qwen3_moe", moe_intermediate_size=256, mlp_only_layers=[0, "1"]), True,
     "field 'mlp_only_layers' = [0, '1']: expected a list of integers"),
    (dict(LLAMA, model_type=7), True, "field 'model_type' = 7: expected a string"),
    (dict(LLAMA, _name_or_path=7), True, "field '_name_or_path' = 7: expected a string"),
    (dict(TINY_MOE, name=["a"]), False, "field 'name' = ['a']: expected a string"),
    (dict(TINY_MOE, bf16="yes"), False, "field 'bf16' = 'yes': expected true or false"),
    (dict(TINY_MOE, kv_channels=64.0), False, "field 'kv_channels' = 64.0: expected a positive integer, got float"),
])
def test_every_field_read_is_type_checked(tmp_path, raw, hf, expect):
    msg = _refused(tmp_path, raw, hf, expect)
    assert "Traceback" not in msg


def test_a_model_yaml_whose_aliases_explode_is_refused_naming_the_file(tmp_path):
    """A model file is YAML a user gives too: its aliases are bounded as a run config's are."""
    f = tmp_path / "bomb.yaml"
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    f.write_text("hidden_size: 512\nrotary_scaling_factor:\n" + "".join(f"  {ln}\n" for ln in lines))
    with pytest.raises(ConfigError) as e:
        load_model(f)
    assert str(f) in str(e.value) and "its YAML aliases expand it by" in str(e.value), str(e.value)
