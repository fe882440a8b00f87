"""What the packed block sessions measure (search.packed, issue 53): their TP, their members, the native points,
and which settings of workload.packing change their measurement settings (the workflow re-measures exactly those:
docs/run-integrity.md), on the committed example's lengths."""
from __future__ import annotations

import copy

import pytest

from tptune.cases import parse_case_id
from tptune.measure.preflight import resolve_here
from tptune.packing.spec import PackingSpec
from tptune.search import packed

from conftest import ROOT, base_config

EXAMPLE = {"lengths": str(ROOT / "config/packing/rl-bimodal.txt"), "rule": "verl", "max_token_len": 1536,
           "seqs_per_step": 16, "forward_passes": 2}


def settings(pool, **packing):
    return resolve_here(base_config(pool, tp_sizes=[2], workload={"packing": {**EXAMPLE, **packing}}),
                        check_hardware=False)


@pytest.mark.parametrize("model_tp,layer_tps,tp", [(4, [2, 4], 4), (1, [2], 2), (None, [2, 4], 2), (8, [2, 4], 2),
                                                   (1, [], None)])
def test_the_packed_sessions_take_the_model_tp_else_the_smallest_measured_one(model_tp, layer_tps, tp):
    got, why = packed.packing_tp(model_tp, layer_tps)
    assert got == tp and why


def test_native_points_are_real_micro_batches_of_the_rule_spanning_their_token_counts(pool_dir):
    s = settings(pool_dir)
    spec = PackingSpec.from_config(s.config)
    lengths = spec.load(".")
    pts = packed.native_points(s, spec, lengths, 2)
    tokens = sorted(mb.padded for st in spec.native_steps(lengths, 2) for mb in st.micro_batches)
    assert [t for t, _ in pts] == sorted({t for t, _ in pts}) and len(pts) == 3
    assert tokens[0] <= pts[0][0] < pts[1][0] < pts[-1][0] <= tokens[-1] + 1
    for t, ls in pts:
        assert t % 2 == 0 and sum(ls) <= t and all(x in set(lengths.tolist()) for x in ls)
    # Megatron-RL's own batching pads every bin to its --seq-length: one token count, a constant fit
    fill = settings(pool_dir, rule="fill")
    assert [t for t, _ in packed.native_points(fill, PackingSpec.from_config(fill.config), lengths, 2)] == [1536]


def test_a_packed_session_measures_the_capacity_beside_the_native_points_every_round(pool_dir):
    s = settings(pool_dir)
    spec = PackingSpec.from_config(s.config)
    lengths = spec.load(".")
    m = packed.packed_measurement(s, 2, 3072, spec, lengths)
    assert m["packing"]["capacity"] == 3072 and m["members"] is None and m["canary"] is None
    bins = m["layer"]["bins"]
    assert set(bins) == {"0", "1", "2", "3"} and sum(bins["0"]) <= 3072
    members, contenders, always = packed.session_members(2, m, {"set": "chunked.n2", "preset": None})
    ids = [c.id for c in members]
    assert ids[:2] == ["layer-tp2-pack3072.b0-none", "layer-tp2-pack3072.b0-chunked.n2"]
    assert contenders == ids[:2] and always == ["layer-tp2-pack3072.b0-chunked.n2"]
    for c, (t, k) in zip(members[2:], m["packing"]["native"]):
        assert c.id == f"layer-tp2-pack{t}.b{k}-none" and sum(bins[str(k)]) <= t
    # te: the best NVIDIA preset contends too
    te = packed.capacity_cases(2, 3072, {"set": "ub.tuned_tp2", "preset": "ub.nemo_tp4"})
    assert [c.variant_id for c in te.values()] == ["none", "ub.tuned_tp2", "ub.nemo_tp4"]


@pytest.mark.parametrize("key,value,measures", [
    ("lengths", {"histogram": {"values": [400, 1500], "counts": [9, 1]}}, True), ("rule", "slime", True),
    ("max_token_len", 2048, True), ("seqs_per_step", 8, True), ("seed", 3, True), ("forward_passes", 1, False),
])
def test_which_packing_settings_re_measure_a_packed_session(pool_dir, key, value, measures):
    """The measure settings of workload.packing: what changes the bins or the native points. The forward-only
    passes only weigh what is measured anyway (every packed round times the forward alone); the capacities say
    which sessions exist, not what one measures."""
    s = settings(pool_dir)
    spec = PackingSpec.from_config(s.config)
    base = packed.packed_measurement(s, 2, 3072, spec, spec.load("."))
    s2 = settings(pool_dir, **{key: value})
    spec2 = PackingSpec.from_config(s2.config)
    got = packed.packed_measurement(s2, 2, 3072, spec2, spec2.load("."))
    assert (got != base) == measures


def test_the_set_is_the_written_file_and_the_preset_the_fastest_nvidia_one(pool_dir):
    te = copy.copy(settings(pool_dir))
    object.__setattr__(te, "backend", "te")
    object.__setattr__(te, "search", te.search.__class__.from_dict({"te_presets": ["nemo_tp4", "nvidia_bf16_tp2"]}))
    rows = [{"variant": v, "case": f"layer-tp2-{v}", "status": "ok", "median_ms": ms}
            for v, ms in (("none", 50.0), ("ub.te", 49.0), ("ub.nemo_tp4", 47.0), ("ub.nvidia_bf16_tp2", 46.0),
                          ("ub.tuned_tp2", 45.0))]
    rec = {"tp": 2, "tuned": "layer-tp2-ub.tuned_tp2", "winner": "layer-tp2-ub.tuned_tp2", "settings": rows}
    assert packed.settings_of(rec, te) == {"set": "ub.tuned_tp2", "preset": "ub.nvidia_bf16_tp2"}
    # a preset beat the tuned combination on the block: the file holds it, and the next preset is the reference
    rec = {**rec, "winner": "layer-tp2-ub.nvidia_bf16_tp2"}
    assert packed.settings_of(rec, te) == {"set": "ub.nvidia_bf16_tp2", "preset": None}
    # no overlap won: the set at T is still the overlap to weigh, the tuned combination
    assert packed.settings_of({**rec, "winner": "layer-tp2-none"}, te)["set"] == "ub.tuned_tp2"
    torch_rec = {"tp": 2, "tuned": "layer-tp2-none", "winner": "layer-tp2-none",
                 "settings": [{"variant": "none"}, {"variant": "nocomm"}, {"variant": "chunked.n4"}]}
    assert packed.settings_of(torch_rec, settings(pool_dir)) == {"set": "chunked.n4", "preset": None}
    assert parse_case_id("layer-tp2-pack3072.b0-chunked.n4").pack.tokens == 3072
