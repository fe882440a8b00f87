"""The memory estimate and the TP floor (tptune.model.memory) against hand calculations and published formulas."""
import json
from fractions import Fraction

import pytest

from tptune.model import memory as M
from tptune.errors import ConfigError
from tptune.model.memory import GIB
from tptune.model.spec import load_model, parse_model
from tptune.decide.tp import tp_floor_for
from tptune.measure.preflight import resolve_here

from conftest import FIXTURES, ROOT, base_config

# An H200 ("141 GB") as torch reports it: total_memory = 139.8 GiB (results/*/cases/*/run.json,
# environment.gpu_memory_gib; nvidia-smi shows 143771 MiB).
H200 = int(139.8 * GIB)
QWEN32_JSON = FIXTURES / "hf" / "qwen2.5-32b.config.json"


def llama70():
    return load_model(ROOT / "config/models/llama3-70b.yaml")


def qwen32():
    return load_model(QWEN32_JSON, {"seq_length": 8192, "micro_batch_size": 1})


# --- hand calculations ---------------------------------------------------------------------------

def test_llama3_70b_by_hand_tp8():
    """Llama-3-70B, TP=8, one node (dp = 8/8 = 1), PP=1, bf16, seq 8192, mbs 1."""
    h, q, kv, f, L = 8192, 64 * 128, 8 * 128, 28672, 80
    t, s = 8, 8192
    layer = (h * (q + 2 * kv) + q * h + h * 2 * f + f * h) // t + 2 * h    # QKV, proj, fc1 (gate+up), fc2; 2 norms
    assert layer == 106_971_136
    vocab = 129_024                          # 128256 padded to a multiple of 128*8
    params = L * layer + 2 * vocab * h // t + h                            # untied embedding + output layer, final norm
    assert params == 8_821_940_224           # x 8 GPUs ~ 70.6B: Llama-3-70B
    r = M.estimate(llama70(), 8, {}, H200, gpus_per_node=8)
    assert (r["dp"], r["pp"], r["params"]) == (1, 1, params)
    assert r["weights"] == 2 * params == 17_643_880_448                   # bf16
    assert r["main_grads"] == 4 * params == 35_287_760_896                # fp32 main grads
    assert r["optimizer"] == 12 * params == 105_863_282_688               # fp32 master + Adam m, v; dp=1: unsharded
    per_token = (2 * 2 * h          # the two norms' inputs
                 + 2 * h            # QKV's input (SP shard)
                 + 2 * (q + 2 * kv)  # Q, K, V
                 + 2 * q            # attention output = proj input
                 + 2 * h            # fc1 input
                 + 2 * 2 * f        # fc1 output (gate and up)
                 + 2 * f)           # fc2 input
    assert per_token == 274_432      # = 33.5 h
    stats = 4 * 64                   # flash attention's fp32 log-sum-exp per head
    assert r["layer_activations"] == (per_token + stats) * s // t == 281_280_512
    assert r["activations"] == L * 281_280_512 == 22_502_440_960
    assert r["output_activations"] == (2 * 2 * h + 4 * vocab) * s // t == 562_036_736
    assert r["total"] == 181_859_401_728 and r["fits"] is False            # 169.4 GiB > 125.8 GiB
    sel = M.estimate(llama70(), 8, {"recompute": "selective"}, H200)
    assert sel["layer_activations"] == per_token * s // t == 281_018_368  # core attention recomputed
    assert sel["activations"] == 22_481_469_440
    assert sel["total"] == r["total"] - L * stats * s // t


def test_llama3_70b_tp2_state_and_optimizer_sharding():
    h, L, t = 8192, 80, 2
    layer = 855_638_016 // t + 2 * h
    params = L * layer + 2 * 128_256 * h // t + h          # 128256 is a multiple of 128*2: no padding
    r = M.estimate(llama70(), 2, {}, H200)                  # dp = 8/2 = 4
    assert r["params"] == params == 35_277_512_704
    assert (r["weights"], r["main_grads"]) == (2 * params, 4 * params)
    assert r["optimizer"] == 12 * params // 4 == 105_832_538_112
    plain = M.estimate(llama70(), 2, {"distributed_optimizer": False}, H200)
    assert plain["optimizer"] == 12 * params and plain["bytes_per_param"] == 18    # the guide's 18
    assert r["bytes_per_param"] == 6 + 12 / 4                                     # and 6 + 12/d


def test_qwen25_32b_by_hand():
    """Qwen2.5-32B from its config.json: hidden 5120, ffn 27648, 40 heads, 8 KV heads, 64 layers, vocab 152064."""
    mc = qwen32()
    h, q, kv, f, L, V, s = 5120, 40 * 128, 8 * 128, 27648, 64, 152_064, 8192
    full = h * (q + 2 * kv) + q * h + h * 2 * f + f * h
    assert full == 487_587_840
    total = L * (full + 2 * h) + 2 * V * h + h
    assert total == 32_763_417_600          # 32.76B (+458,752 QKV biases, not counted: 32,763,876,352)
    r1 = M.estimate(mc, 1, {}, H200)
    assert r1["params"] == total
    assert r1["weights"] == 65_526_835_200  # "its bf16 weights are 65 GB"
    assert r1["main_grads"] == 131_053_670_400  # "and the fp32 main gradients another 131 GB"
    assert r1["fits"] is False
    # TP=4, dp = 8/4 = 2
    params = L * (full // 4 + 2 * h) + 2 * V * h // 4 + h
    assert params == 8_191_349_760
    r = M.estimate(mc, 4, {}, H200)
    assert (r["dp"], r["params"]) == (2, params)
    assert r["weights"] == 2 * params and r["main_grads"] == 4 * params
    assert r["optimizer"] == 12 * params // 2 == 49_148_098_560
    per_token = 2 * 2 * h + 2 * h + 2 * (q + 2 * kv) + 2 * q + 2 * h + 2 * 2 * f + 2 * f
    assert per_token == 231_424
    assert r["activations"] == L * (per_token + 4 * 40) * s // 4 == 30_354_178_048
    assert r["output_activations"] == (4 * h + 4 * V) * s // 4 == 1_287_651_328
    assert r["total"] == 129_938_026_496 and r["fits"] is True       # 121.0 GiB <= 125.8 GiB
    sel = M.estimate(mc, 4, {"recompute": "selective"}, H200)
    assert sel["activations"] == L * per_token * s // 4 == 30_333_206_528
    full_rc = M.estimate(mc, 4, {"recompute": "full"}, H200)
    assert full_rc["activations"] == L * 2 * h * s // 4 + (per_token + 4 * 40) * s // 4   # inputs + one layer


# --- published references --------------------------------------------------------------------------

GPT3 = parse_model({"hidden_size": 12288, "ffn_hidden_size": 4 * 12288, "num_attention_heads": 96,
                    "num_layers": 96, "vocab_size": 51200, "workload": {"seq_length": 2048}}, "gpt3-175b")


@pytest.mark.parametrize("t, sp, recompute, formula", [
    # Korthikanti et al. 2022, Table 2 (bytes per layer; s, b, h, a, t)
    (1, False, "none", lambda s, b, h, a, t: s * b * h * (34 + Fraction(5 * a * s, h))),
    (8, False, "none", lambda s, b, h, a, t: s * b * h * (10 + Fraction(24, t) + Fraction(5 * a * s, h * t))),
    (8, True, "none", lambda s, b, h, a, t: Fraction(s * b * h, t) * (34 + Fraction(5 * a * s, h))),
    (8, False, "selective", lambda s, b, h, a, t: s * b * h * (10 + Fraction(24, t))),
    (8, True, "selective", lambda s, b, h, a, t: Fraction(s * b * h * 34, t)),
    (1, False, "full", lambda s, b, h, a, t: 2 * s * b * h),
])
def test_korthikanti_table2_on_gpt3(t, sp, recompute, formula):
    m = GPT3.model
    for b in (1, 2):
        got = M.layer_activations(m, 2048, b, t, 2, recompute=recompute, sequence_parallel=sp, flash=False,
                                  dropout=True)
        assert got["total"] == formula(2048, b, 12288, 96, t)


def test_megatron_theoretical_memory_formulas():
    """megatron/training/theoretical_memory_usage.py: per layer sbh(18 + 4f/h)/t with SP + selective
    (ungated MLP, dropout), weights and optimizer (params / t) * (6 + 12/d)."""
    m = parse_model({"hidden_size": 4096, "ffn_hidden_size": 14336, "num_attention_heads": 32, "num_layers": 32,
                     "vocab_size": 32000, "untie_embeddings_and_output_weights": True,
                     "workload": {"seq_length": 4096}}, "mha-ungated").model
    s, h, f, t = 4096, 4096, 14336, 4
    got = M.layer_activations(m, s, 1, t, 2, recompute="selective", flash=False, dropout=True)["total"]
    assert got == Fraction(s * h, t) * (18 + Fraction(4 * f, h))
    mc = parse_model({**{k: getattr(m, k) for k in ("hidden_size", "ffn_hidden_size", "num_attention_heads",
                                                    "num_layers", "vocab_size")},
                      "untie_embeddings_and_output_weights": True, "workload": {"seq_length": s, "dtype": "bf16"}})
    r = M.estimate(mc, t, {"dp": 16}, H200)
    layer = 2 * h * h * 2 + 2 * h * (f + 1)          # their count: attention 4h^2 (MHA), MLP 2hf, norms 2h
    padded = 32_256                                  # 32000 padded to a multiple of 128*4
    megatron_params = (32 * layer + h + 2 * padded * h) / t
    # they also divide the norms by t; tptune keeps them whole (they are replicated over TP)
    assert r["params"] == megatron_params + (32 * 2 * h + h) * (1 - 1 / t)
    state = r["weights"] + r["main_grads"] + r["optimizer"]
    assert state == pytest.approx(r["params"] * (6 + 12 / 16), abs=1)


def test_bytes_per_parameter_follow_the_distributed_optimizer_guide():
    for dtype, plain, dist in (("bf16", 18, 6 + 12 / 8), ("fp16", 20, 4 + 16 / 8), ("fp32", 16, 8 + 8 / 8)):
        mc = load_model(ROOT / "config/models/llama3-8b.yaml", {"dtype": dtype})
        assert M.estimate(mc, 1, {"distributed_optimizer": False})["bytes_per_param"] == plain
        assert M.estimate(mc, 1, {"dp": 8})["bytes_per_param"] == dist


# --- the floor ------------------------------------------------------------------------------------

def test_qwen25_32b_config_json_floor_on_h200():
    for mem in (H200, int(141 * GIB)):
        f = M.tp_floor(qwen32(), [1, 2, 4], None, mem, 8)
        assert f["status"] == "fits" and f["floor_tp"] == 4 and f["floor_tp"] >= 2
        fits = {r["tp"]: r["fits"] for r in f["table"]}
        assert fits == {1: False, 2: False, 4: True, 8: True}
        assert "TP=1: does not fit" in f["why"] and "TP=2: does not fit" in f["why"]
        json.dumps(f)                                  # the table is JSON-serialisable
    # the optimizer sharded over 32 data-parallel ranks is not enough for TP=2; with full recompute it is
    assert M.tp_floor(qwen32(), [2, 4], {"dp": 32}, H200, 8)["floor_tp"] == 4
    assert M.tp_floor(qwen32(), [2, 4], {"dp": 32, "recompute": "full"}, H200, 8)["floor_tp"] == 2


def test_llama3_70b_floors():
    f = M.tp_floor(llama70(), [2, 4, 8], {}, H200, 8)         # defaults: PP=1, dp = 8/TP
    assert f["status"] == "no_fit" and f["floor_tp"] is None
    assert not any(r["fits"] for r in f["table"])
    assert f["smallest_layout"]["tp"] == 8 and f["smallest_layout"]["pp"] == 2
    assert "no TP up to 8 fits; the smallest layout that fits is TP=8 x PP=2" in f["why"]
    p4 = M.tp_floor(llama70(), [2, 4, 8], {"pp": 4}, H200, 8)  # NeMo's recipe: TP 4 x PP 4
    assert p4["status"] == "fits" and p4["floor_tp"] == 4
    r4 = next(r for r in p4["table"] if r["tp"] == 4)
    assert r4["stage"] == "first" and len(r4["stages"]) == 4
    # first stage: 20 layers, the embedding, 4 micro-batches in flight (1F1B) = 80 layers' activations
    assert r4["activations"] == 80 * r4["layer_activations"] and r4["output_activations"] == 0
    assert r4["stages"][0]["total"] > r4["stages"][-1]["total"]


def test_nothing_fits_at_all():
    f = M.tp_floor(llama70(), [8], {}, 16 * GIB, 8)
    assert f["status"] == "no_fit" and f["smallest_layout"] is None
    assert "no TP x PP layout up to PP=80 fits either" in f["why"]
    assert "none in the node" in M.markdown_table(f)


def test_min_tp_overrides_and_checks_off():
    f = M.tp_floor(qwen32(), [2, 4], None, H200, 8, min_tp=2)
    assert (f["floor_tp"], f["status"]) == (2, "override")
    assert "floor is TP=4" in f["why"] and "the estimate says TP=2 does not fit" in f["why"]
    off = M.tp_floor(qwen32(), [2, 4], {"memory_check": False}, None, 8)
    assert (off["floor_tp"], off["status"], off["table"]) == (1, "unchecked", [])


def test_missing_fields_are_named_and_min_tp_lets_the_run_go_on():
    bare = parse_model({"hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8,
                        "workload": {"seq_length": 64}}, "bare.yaml")
    with pytest.raises(ConfigError) as e:
        M.tp_floor(bare, [2], None, H200, 8)
    msg = str(e.value)
    assert "bare.yaml" in msg and "'num_layers' (Hugging Face config.json: 'num_hidden_layers') is missing" in msg
    assert "'vocab_size' is missing" in msg and "decision.min_tp" in msg
    f = M.tp_floor(bare, [2], None, None, 8, min_tp=2)
    assert f["floor_tp"] == 2 and "model file lacks" in f["why"]
    assert M.tp_floor(bare, [2], {"memory_check": False}, None, 8)["floor_tp"] == 1
    assert M.config_problems({"parallel": {}}, bare) and not M.config_problems({"decision": {"min_tp": 2}}, bare)


def test_unknown_gpu_memory_is_named():
    with pytest.raises(ConfigError, match="hardware.gpu_memory_gb"):
        M.tp_floor(qwen32(), [2], None, None, 8)


def test_tied_embeddings():
    tied = parse_model({"hidden_size": 1024, "ffn_hidden_size": 4096, "num_attention_heads": 16, "num_layers": 4,
                        "vocab_size": 1024, "workload": {"seq_length": 128}}, "tied.yaml")
    untied = parse_model({**tied.to_dict()["model"], "untie_embeddings_and_output_weights": True,
                          "workload": {"seq_length": 128}})
    a, b = M.estimate(tied, 1, {}), M.estimate(untied, 1, {})
    assert b["params"] - a["params"] == 1024 * 1024 and a["tied_embeddings_assumed"]
    pp2 = M.estimate(tied, 1, {"pp": 2})          # the last stage holds its own copy for the output layer
    assert pp2["stages"][1]["total"] > 0 and a["gpu_memory"] is None and a["fits"] is None


def test_settings_and_gpu_memory_sources(pool_dir):
    assert M.gpu_memory_bytes({"gpu_memory_gb": 80}, "cuda", recorded_gib=139.8) == 80 * GIB
    assert M.gpu_memory_bytes({}, "cuda", recorded_gib=139.8) == int(139.8 * GIB)
    assert M.gpu_memory_bytes({}, "cpu", ranks_per_host=8) > 0
    s = resolve_here(base_config(pool_dir))                      # the CPU default: tiny model, everything fits
    f = tp_floor_for(s)
    assert f["status"] == "fits" and f["floor_tp"] == 1 and f["floor_in_tps"] is False
    cfg = base_config(pool_dir, parallel={"dp": 0, "recompute": "some", "pp": 3}, decision={"min_tp": 2})
    probs = M.config_problems(cfg)
    assert any("'parallel.dp' = 0" in p for p in probs) and any("parallel.recompute" in p for p in probs)
    assert any("'parallel.pp' = 3: does not divide" in p
               for p in M.config_problems(base_config(pool_dir, parallel={"pp": 3}), s.model))
    with pytest.raises(ConfigError, match="parallel.recompute"):
        resolve_here(base_config(pool_dir, parallel={"recompute": "some"}))
    assert resolve_here(base_config(pool_dir, parallel={"dp": 4}, decision={"min_tp": 2},
                                    hardware={"gpu_memory_gb": 139.8})).parallel.dp == 4
