"""The memory check for MoE models (tptune.model.memory): parameter counts against the public totals, EP/ETP
sharding of the routed experts, the expert layout's validation, drop-less MoE activations."""
import pytest

from tptune.model import memory as M
from tptune.errors import ConfigError
from tptune.model.memory import GIB
from tptune.model.spec import load_model

from conftest import FIXTURES

H200 = int(139.8 * GIB)


def hf(name, seq=4096):
    return load_model(FIXTURES / "hf" / f"{name}.config.json", {"seq_length": seq, "micro_batch_size": 1})


# name: (public total, public active) in billions; model cards / papers. Active per each publisher's
# convention: GPT-OSS (OpenAI's card: 116.83B / 5.13B) leaves the input embedding out.
PUBLIC = {
    "qwen3-30b-a3b": (30.5, 3.3, "active"),
    "mixtral-8x7b-v0.1": (46.7, 12.9, "active"),
    "deepseek-v3": (671, 37, "active"),
    "gpt-oss-120b": (117, 5.1, "active_without_embedding"),
}


@pytest.mark.parametrize("name", PUBLIC)
def test_totals_match_public(name):
    total, active, key = PUBLIC[name]
    p = M.model_params(hf(name).model)
    assert p["total"] / 1e9 == pytest.approx(total, rel=0.03)
    assert p[key] / 1e9 == pytest.approx(active, rel=0.03)


def test_deepseek_v3_parts_and_mtp():
    p = M.model_params(hf("deepseek-v3").model)
    # MTP: 14B in the checkpoint, which also stores its own embedding and output layer (2 x 129280 x 7168)
    assert (p["mtp"] + 2 * 129280 * 7168) / 1e9 == pytest.approx(14, rel=0.05)
    assert p["routed_experts"] == 58 * 256 * 3 * 7168 * 2048
    assert p["router"] == 58 * 256 * 7168 and p["shared_experts"] == 58 * 3 * 7168 * 2048
    assert p["dense_mlp"] == 3 * 3 * 7168 * 18432
    # MLA per layer: q down/up, kv down/up, proj, latent norms
    mla = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168 + 1536 + 512
    assert p["attention"] == 61 * mla


def test_dense_model_unchanged_by_moe_terms():
    p = M.model_params(hf("llama-3.1-70b").model)
    assert p["total"] == p["active"] and p["routed_experts"] == 0
    assert p["total"] / 1e9 == pytest.approx(70.6, rel=0.01)


def test_doubling_ep_halves_the_routed_expert_share():
    mc = hf("qwen3-30b-a3b")
    rs = [M.estimate(mc, 2, {"ep": ep, "etp": 1}, H200) for ep in (1, 2, 4)]
    assert [r["problems"] for r in rs] == [[], [], []]
    assert rs[0]["expert_params"] == 48 * 128 * 3 * 2048 * 768
    assert rs[1]["expert_params"] * 2 == rs[0]["expert_params"] == rs[2]["expert_params"] * 4
    # the non-expert part stays
    assert rs[0]["params"] - rs[0]["expert_params"] == rs[2]["params"] - rs[2]["expert_params"]
    # expert data-parallel group dp*tp/(ep*etp): 4*2/ep; the expert optimizer shards over it
    assert [r["edp"] for r in rs] == [8, 4, 2]
    assert rs[0]["total"] > rs[1]["total"] > rs[2]["total"]


def test_etp_defaults_to_tp_and_shards_experts():
    mc = hf("mixtral-8x7b-v0.1")
    r = M.estimate(mc, 4, {}, H200)
    assert (r["ep"], r["etp"], r["edp"]) == (1, 4, 2)
    assert r["expert_params"] == 32 * 8 * 3 * 4096 * 14336 // 4
    assert M.estimate(mc, 4, {"etp": 1}, H200)["expert_params"] == 4 * r["expert_params"]


def test_expert_optimizer_sharded_over_expert_dp():
    mc = hf("qwen3-30b-a3b")
    r = M.estimate(mc, 1, {"ep": 8}, H200)   # dp 8, tp 1, ep 8, etp 1: expert dp 1
    dense = r["params"] - r["expert_params"]
    assert r["edp"] == 1
    assert r["optimizer"] == pytest.approx(dense * 12 / 8 + r["expert_params"] * 12, abs=2)
    assert r["expert_state"] == r["expert_params"] * (2 + 4 + 12)


def test_moe_activations_dropless_topk():
    m = hf("qwen3-30b-a3b").model
    s, t, k, h, fe = 4096, 2, 8, 2048, 768
    a = M.layer_activations(m, s, 1, t, 2, kind="moe")
    assert a["expert_input"] == 2 * h * k * t * s // t        # ETP = TP: all-gathered tokens, k copies
    assert a["expert_fc1_output"] == 2 * 2 * fe * k * s // t
    assert a["expert_fc2_input"] == 2 * fe * k * s // t
    assert "fc1_output" not in a and "shared_fc1_output" not in a
    assert M.layer_activations(m, s, 1, t, 2, kind="moe", etp=1)["expert_input"] == a["expert_input"] // t
    sh = M.layer_activations(hf("deepseek-v2-lite").model, s, 1, t, 2, kind="moe")
    assert sh["shared_fc1_output"] == 2 * 2 * 2816 * s // t


def test_moe_floor_and_ep_lowers_it():
    mc = hf("qwen3-30b-a3b")
    assert M.tp_floor(mc, [1, 2, 4], {}, H200)["floor_tp"] == 4
    f = M.tp_floor(mc, [1, 2, 4], {"ep": 8, "etp": 1}, H200)
    assert f["floor_tp"] == 1
    md = M.markdown_table(f)
    assert "MoE layout assumed" in md and "etp = 1; ep = 8" in md and "TP=1: 3.62B, 60.8 GiB" in md
    why = M.tp_floor(mc, [1, 2, 4], {}, H200)["why"]
    assert "of which routed experts 202.5 GiB (28.99B params, ep=1 x etp=1, expert dp=8)" in why
    assert "MoE layout" not in M.markdown_table(M.tp_floor(hf("llama-3.1-8b"), [1, 2], {}, H200))


def test_layout_validation_names_the_field():
    moe, dense = hf("mixtral-8x7b-v0.1"), hf("llama-3.1-8b")
    p = M.config_problems({"parallel": {"ep": 3}}, moe)
    assert any("'parallel.ep' = 3" in x and "8 routed experts" in x for x in p)
    p = M.config_problems({"parallel": {"ep": 8, "etp": 2}}, moe)
    assert any("'parallel.ep' = 8" in x and "exceeds the 8 GPUs" in x for x in p)
    assert M.config_problems({"parallel": {"ep": 8, "etp": 1}}, moe) == []
    assert any("'parallel.ep' = 2" in x and "no experts" in x for x in M.config_problems({"parallel": {"ep": 2}}, dense))
    assert any("'parallel.ep' = 0" in x for x in M.parallel_problems({"ep": 0}))
    assert any("'parallel.etp'" in x for x in M.parallel_problems({"etp": "tp"}))
    with pytest.raises(ConfigError, match="parallel.ep"):
        M.parallel_settings({"ep": -1})
    # a TP at which ep*etp does not divide dp*tp cannot run: a problem of that row, not a fit
    r = M.estimate(moe, 8, {"ep": 2}, H200)
    assert r["fits"] is False and "parallel.ep=2" in r["problems"][-1]
