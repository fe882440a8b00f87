"""noise.compare_points on points measured in rounds, cost_key from effective ub_cfgs, bisect with pairs."""
import math
import random
import statistics

import pytest

from tptune.stats.noise import compare, compare_points, cost_key, margin

from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import make_point

from tptune.search.bisect import next_points, result

RING = "fc2-tp2-ub.te+fprop.ring"          # fc2_fprop ring (1 SM) + fc2_dgrad ring (1 SM)
NVIDIA = "fc2-tp2-ub.nvidia_bf16_tp2"      # fc2_fprop pipeline 16 SMs + fc2_dgrad ring 1 SM
SESSION = "fc2/tp2/point"


def rpt(case, rounds, session=SESSION, samples=None, ids=None):
    """A round-measured point as run.json has it (median of rounds, rounds, round ids, samples)."""
    vals = list(rounds)
    st = {"median": statistics.median(vals), "rounds": vals,
          "round_ids": list(range(len(vals))) if ids is None else ids}
    if samples is not None:
        st["samples"] = samples
        st["n"] = len(samples)
    return MeasuredPoint.from_dict({"case": case, "status": "ok", "session": session, "timing": {"total_ms": st}})


BASE = [10.0, 10.4, 9.7, 10.2, 9.9]       # round-to-round drift shared by the members of a session


def scaled(case, f, wobble=None, **kw):
    w = wobble or [0.0] * len(BASE)
    return rpt(case, [b * f * math.exp(e) for b, e in zip(BASE, w)], **kw)


# -- cost_key from the effective ub_cfgs -----------------------------------------------------------

def test_cost_counts_the_presets_own_sms():
    assert cost_key(RING)[3] == 2
    assert cost_key(NVIDIA)[3] == 17            # the preset's fc2_fprop pipeline takes 16 SMs
    assert cost_key("proj-tp2-ub.nvidia_bf16_tp2")[3] == 33   # proj_fprop pipeline 32 SMs
    assert cost_key("proj-tp2-ub.te+fprop.ring")[3] == 2
    assert cost_key("qkv-tp2-ub.nvidia_bf16_tp2")[3] == 16 + 24 + 1
    assert cost_key(RING) < cost_key(NVIDIA)
    assert cost_key("proj-tp2-ub.te+fprop.ring") < cost_key("proj-tp2-ub.nvidia_bf16_tp2")
    # fewer overrides no longer hides a preset's SMs: the override-free preset is the dearer one
    assert len(cost_key(NVIDIA)) == len(cost_key(RING)) and cost_key(NVIDIA)[5] < cost_key(RING)[5]


def test_cost_unknown_preset_falls_back_to_overrides():
    assert cost_key("fc2-tp2-ub.nosuchpreset+fprop.ring")[3] == 1


# -- compare_points with rounds --------------------------------------------------------------------

def test_rounds_clear_win_both_orders():
    a, b = scaled(RING, 1.0), scaled(NVIDIA, 1.05)
    cmp = compare_points(a, b)
    assert cmp.outcome == -1 and cmp.winner_case == RING and cmp.reason == "faster"
    assert cmp.resolved is True and cmp.margin == 0.02
    assert cmp.ratio.paired and cmp.ratio.rounds == 5
    assert cmp.ratio.ratio == pytest.approx(1 / 1.05)
    d = cmp.to_dict()
    assert d["ratio"] == {"ratio": round(1 / 1.05, 5), "lo": round(1 / 1.05, 5), "hi": round(1 / 1.05, 5),
                          "rounds": 5, "paired": True}
    assert d["resolved"] is True and d["winner"] == RING and d["winner_side"] == "a"
    rev = compare_points(b, a)
    assert rev.outcome == 1 and rev.winner == "b" and rev.winner_case == RING
    assert rev.ratio.ratio == pytest.approx(1.05)


def test_rounds_resolved_tie_goes_to_the_cheaper_case():
    wob = [0.001, -0.001, 0.0005, -0.0005, 0.0]
    ring, nv = scaled(RING, 1.01, wob), scaled(NVIDIA, 1.0)       # ring 1% slower: within 2%
    for a, b in ((ring, nv), (nv, ring)):
        cmp = compare_points(a, b)
        assert cmp.outcome == 0 and cmp.resolved is True
        assert cmp.winner_case == RING and cmp.reason == "tie: cheaper"
        assert 0.98 <= cmp.ratio.lo <= cmp.ratio.hi <= 1.02
        assert cmp.to_dict()["resolved"] is True


def test_rounds_undecided_is_a_tie_marked_unresolved():
    wob = [0.03, -0.03, 0.02, -0.02, 0.0]                         # round-level noise of 2-3%
    nv, ring = scaled(NVIDIA, 1.0), scaled(RING, 1.015, wob)
    cmp = compare_points(nv, ring)
    assert cmp.outcome == 0 and cmp.resolved is False
    assert cmp.winner_case == RING and cmp.reason == "undecided (tie): cheaper"
    assert cmp.ratio.lo < 0.98 or cmp.ratio.hi > 1.02
    assert cmp.to_dict()["resolved"] is False
    pref = compare_points(nv, ring, tie="a")
    assert pref.winner_case == NVIDIA and pref.reason == "undecided (tie): preferred"


def test_rounds_ignore_the_spread_of_iterations():
    """Iterations spread +-30%, rounds a steady 5% apart: the rounds decide, the samples would not."""
    spread = [0.7, 0.85, 1.0, 1.15, 1.3]
    a = scaled(RING, 1.0, samples=[10 * s for s in spread])
    b = scaled(NVIDIA, 1.05, samples=[10.5 * s for s in spread])
    assert compare_points(a, b).outcome == -1
    strip = lambda p: p.with_(timing={"total_ms": p.timing["total_ms"].without("rounds", "round_ids")})
    old = compare_points(strip(a), strip(b))
    assert old.ratio is None and old.outcome == 0 and old.margin > 0.1


def test_rounds_across_sessions_are_unpaired():
    a = scaled(RING, 1.0, session="s1")
    b = scaled(NVIDIA, 1.05, session="s2")
    cmp = compare_points(a, b)
    assert cmp.ratio.paired is False and cmp.to_dict()["ratio"]["paired"] is False
    # the drift of BASE (about +-4%) is now in the interval: 5% is no longer beyond 2% for sure
    assert cmp.outcome == 0 and cmp.resolved is False


def test_one_common_round_falls_back_to_the_sample_rule():
    a = rpt(RING, [10.0], samples=[10.0] * 5)
    b = rpt(NVIDIA, [11.0], samples=[11.0] * 5)
    cmp = compare_points(a, b)
    assert cmp.ratio is None and "ratio" not in cmp.to_dict()
    assert cmp.outcome == -1 and cmp.margin == margin(a, b)


def test_failed_point_loses_to_a_round_point():
    ok = scaled(NVIDIA, 1.0)
    bad = MeasuredPoint(RING, "failed", SESSION)
    for a, b, side in ((ok, bad, "a"), (bad, ok, "b")):
        cmp = compare_points(a, b)
        assert cmp.winner == side and cmp.winner_case == NVIDIA and cmp.reason == "faster"
        assert cmp.ratio is None and "ratio" not in cmp.to_dict()
    assert compare_points(ok, bad).to_dict()["b"]["median_ms"] is None
    # a failed point keeps its rounds field out of the comparison even if present
    bad2 = scaled(RING, 0.5).with_(status="failed")
    assert compare_points(ok, bad2).winner_case == NVIDIA


def test_points_without_rounds_use_the_sample_rule():
    a = make_point(RING, [10.0 * (1 + 0.001 * i) for i in range(10)])
    b = make_point(NVIDIA, [10.1 * (1 + 0.001 * i) for i in range(10)])
    cmp = compare_points(a, b)
    assert cmp.ratio is None and cmp.resolved is True
    assert cmp.margin == margin(a, b) == 0.02
    assert cmp.outcome == compare(a, b, cmp.margin) == 0
    assert cmp.winner_case == RING and cmp.reason == "tie: cheaper"
    c = make_point(NVIDIA, [11.0] * 10)
    assert compare_points(a, c).outcome == -1
    # one side with rounds, the other without: the sample rule too
    assert compare_points(scaled(RING, 1.0), b).ratio is None


# -- bisect with pairs -----------------------------------------------------------------------------

CANDS = [1, 2, 4, 8, 16, 24, 32]


def session_pair(left, right, ms, sid, seed, rounds=4, noise=0.005):
    """Two points measured side by side: shared round drift, own noise."""
    rng = random.Random(seed)
    drifts = [math.exp(rng.gauss(0, 0.03)) for _ in range(rounds)]
    mk = lambda v: rpt(f"qkv-tp2-ub.te+dgrad.bulk.sm{v}",
                       [ms[v] * d * math.exp(rng.gauss(0, noise)) for d in drifts], session=sid)
    return mk(left), mk(right)


def test_pairs_ask_for_both_values_of_an_unmeasured_step():
    assert next_points(CANDS, {}, pairs={}) == [8, 16]
    ms = {v: 10.0 + abs(i - 1) for i, v in enumerate(CANDS)}       # minimum at 2
    pairs = {(8, 16): session_pair(8, 16, ms, "step0", 0)}
    # step 2 compares 2 and 4; 4 and 8 were measured before, still both are asked
    measured = {8: pairs[(8, 16)][0], 16: pairs[(8, 16)][1], 4: make_point("x", [1.0])}
    assert next_points(CANDS, measured, pairs=pairs) == [2, 4]
    assert next_points(CANDS, measured) == [2]          # without pairs: only what is missing


def test_single_candidate_needs_no_measurement_with_pairs():
    assert next_points([8], {}, pairs={}) == []
    assert result([8], {}, pairs={}) == (8, [])
    assert next_points([8], {}) == [8]                    # without pairs the lone value is measured
    with pytest.raises(ValueError, match="not finished"):
        result(CANDS, {}, pairs={})


@pytest.mark.parametrize("at", range(len(CANDS)))
def test_pairs_find_the_minimum_of_a_v_curve(at):
    ms = {v: 10.0 * (1 + 0.08 * abs(i - at)) for i, v in enumerate(CANDS)}
    pairs, steps = {}, 0
    while todo := next_points(CANDS, {}, pairs=pairs):
        assert len(todo) == 2 and tuple(todo) not in pairs
        pairs[tuple(todo)] = session_pair(*todo, ms, f"step{steps}", seed=100 * at + steps)
        steps += 1
    best, path = result(CANDS, {}, pairs=pairs)
    assert best == CANDS[at]
    assert steps == len(path) <= math.ceil(math.log2(len(CANDS)))
    for rec in path:
        assert rec["comparison"]["ratio"]["paired"] is True and rec["comparison"]["resolved"] is True
        assert tuple(rec["compared"]) in pairs


def test_pairs_tie_keeps_the_cheaper_half():
    ms = {v: 10.0 for v in CANDS}                           # flat: every step a tie -> leftmost
    pairs = {}
    while todo := next_points(CANDS, {}, pairs=pairs):
        pairs[tuple(todo)] = session_pair(*todo, ms, "s", seed=len(pairs), noise=0.001)
    best, path = result(CANDS, {}, pairs=pairs)
    assert best == 1
    assert all(rec["comparison"]["outcome"] == 0 for rec in path)
