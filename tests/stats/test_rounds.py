"""search.rounds: rotation, t quantiles, paired/unpaired ratio intervals, outcomes, adaptive stopping
(futility included), drift."""
import math
import random
import statistics

import pytest

from tptune.records.measured_point import MeasuredPoint, TimingSummary
from tptune.stats.rounds import (FUTILITY_MIN_ROUNDS, Ratio, center, could_clear, drift, measured_next, paired_ratio, point_rounds, ratio_of, rotation, session_state, should_stop, t975, unpaired_ratio)

M = 0.02  # the default noise floor / session margin


def rpt(case, rounds, session="qkv/tp2/point", ids=None, status="ok"):
    """A point in run.json layout measured in rounds ({round id: ms} or a list with ``ids``)."""
    if isinstance(rounds, dict):
        ids = sorted(rounds)
        vals = [rounds[i] for i in ids]
    else:
        vals = list(rounds)
        ids = list(range(len(vals))) if ids is None else ids
    return MeasuredPoint.from_dict({"case": case, "status": status, "session": session, "timing": {
        "total_ms": {"median": statistics.median(vals), "rounds": vals, "round_ids": ids}}})


# -- rotation ---------------------------------------------------------------------------------------

def test_rotation_orders():
    m = ["a", "b", "c"]
    assert rotation(m, 0) == ["a", "b", "c"]
    assert rotation(m, 1) == ["b", "c", "a"]
    assert rotation(m, 2) == ["c", "a", "b"]
    assert rotation(m, 3) == ["a", "b", "c"]
    assert rotation(m, 7) == rotation(m, 1)
    assert rotation([], 5) == []
    assert m == ["a", "b", "c"]  # not mutated


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_every_member_takes_every_position(n):
    members = [f"m{i}" for i in range(n)]
    orders = [rotation(members, r) for r in range(n)]
    assert all(sorted(o) == members for o in orders)
    for pos in range(n):
        assert sorted(o[pos] for o in orders) == members


# -- t975 -------------------------------------------------------------------------------------------

def test_t975_table_and_tails():
    assert t975(0) == math.inf and t975(0.5) == math.inf
    assert t975(1) == 12.706
    assert t975(2) == 4.303
    assert t975(2.9) == 4.303          # non-integer (Welch) df rounds down: conservative
    assert t975(6 - 1e-12) == 2.447    # ... but an integer df computed as 5.999... is 6
    assert t975(10) == 2.228
    assert t975(30) == 2.042
    assert t975(31) == 1.96 and t975(1000) == 1.96
    vals = [t975(d) for d in range(1, 40)]
    assert all(x >= y for x, y in zip(vals, vals[1:]))


# -- paired_ratio -----------------------------------------------------------------------------------

def test_paired_constant_ratio_has_zero_width():
    a = {0: 11.0, 1: 22.0, 2: 33.0}
    b = {0: 10.0, 1: 20.0, 2: 30.0}
    r = paired_ratio(a, b)
    assert r.ratio == pytest.approx(1.1) and r.lo == pytest.approx(1.1) and r.hi == pytest.approx(1.1)
    assert r.rounds == 3 and r.paired is True


def test_paired_exact_values_two_rounds():
    r = paired_ratio({0: 2.0, 1: 4.0}, {0: 1.0, 1: 1.0})
    ln2 = math.log(2)
    # d = [ln2, 2 ln2]: mean 1.5 ln2, sd ln2/sqrt2, half = 12.706 * sd / sqrt2 = 6.353 ln2
    assert r.ratio == pytest.approx(2 ** 1.5)
    assert r.lo == pytest.approx(math.exp((1.5 - 6.353) * ln2))
    assert r.hi == pytest.approx(math.exp((1.5 + 6.353) * ln2))
    assert r.rounds == 2


def test_paired_exact_values_three_rounds():
    e = 0.01
    a = {0: 10 * math.exp(0.1 + e), 1: 10 * math.exp(0.1), 2: 10 * math.exp(0.1 - e)}
    b = {0: 10.0, 1: 10.0, 2: 10.0}
    r = paired_ratio(a, b)
    half = 4.303 * e / math.sqrt(3)  # sd of (e, 0, -e) is e
    assert r.ratio == pytest.approx(math.exp(0.1))
    assert r.lo == pytest.approx(math.exp(0.1 - half))
    assert r.hi == pytest.approx(math.exp(0.1 + half))
    assert r.lo < r.ratio < r.hi


def test_paired_uses_common_rounds_only_and_cancels_round_drift():
    drift_by_round = {0: 1.0, 1: 1.3, 2: 0.8, 3: 1.1}
    a = {k: 10.5 * f for k, f in drift_by_round.items()}
    b = {k: 10.0 * f for k, f in drift_by_round.items() if k != 3}
    b[9] = 99.0  # a round of b alone: ignored
    r = paired_ratio(a, b)
    assert r.rounds == 3
    assert r.ratio == pytest.approx(1.05) and r.hi - r.lo == pytest.approx(0, abs=1e-12)
    # the same values unpaired carry the 30% drift into the interval
    u = unpaired_ratio(list(a.values()), [b[k] for k in (0, 1, 2)])
    assert u.paired is False and u.hi - u.lo > 0.3


def test_paired_none_without_common_round_and_drops_nonpositive():
    assert paired_ratio({0: 1.0}, {1: 1.0}) is None
    assert paired_ratio({}, {}) is None
    assert paired_ratio({0: 0.0}, {0: 1.0}) is None
    r = paired_ratio({0: 0.0, 1: 2.0, 2: 2.0}, {0: 1.0, 1: 1.0, 2: 1.0})
    assert r.rounds == 2 and r.ratio == pytest.approx(2.0)


def test_single_round_has_infinite_hi():
    r = paired_ratio({4: 12.0}, {4: 10.0})
    assert r.ratio == pytest.approx(1.2) and r.lo == 0.0 and r.hi == math.inf and r.rounds == 1
    assert r.outcome(M) == (0, False)
    assert r.to_dict() == {"ratio": 1.2, "lo": 0.0, "hi": None, "rounds": 1, "paired": True}


def _rounds_with_spread(n, ratio=1.03, e=0.01):
    """n rounds whose log ratios alternate ln(ratio) +- e: the same spread at every n."""
    a = {i: 10 * ratio * math.exp(e if i % 2 else -e) for i in range(n)}
    return a, {i: 10.0 for i in range(n)}


def test_more_rounds_same_spread_narrower_interval():
    widths = []
    for n in (2, 4, 8, 16, 32):
        r = paired_ratio(*_rounds_with_spread(n))
        assert r.lo < r.ratio < r.hi
        assert r.ratio == pytest.approx(1.03)
        widths.append(math.log(r.hi) - math.log(r.lo))
    assert all(w1 > w2 for w1, w2 in zip(widths, widths[1:]))
    # 4 rounds: sd = e*sqrt(4/3), half = 3.182 * sd / 2
    r4 = paired_ratio(*_rounds_with_spread(4))
    assert math.log(r4.hi / r4.ratio) == pytest.approx(3.182 * 0.01 * math.sqrt(4 / 3) / 2)


def test_interval_contains_ratio_on_random_inputs():
    rng = random.Random(7)
    for _ in range(50):
        n = rng.randint(2, 10)
        a = {i: rng.uniform(5, 15) for i in range(n)}
        b = {i: rng.uniform(5, 15) for i in range(n)}
        r = paired_ratio(a, b)
        assert r.lo <= r.ratio <= r.hi
        inv = paired_ratio(b, a)  # symmetric: b/a is the reciprocal interval
        assert inv.ratio == pytest.approx(1 / r.ratio)
        assert inv.lo == pytest.approx(1 / r.hi) and inv.hi == pytest.approx(1 / r.lo)


# -- unpaired_ratio ---------------------------------------------------------------------------------

def test_unpaired_exact_welch():
    # la = ln2 + (+.1, -.1, +.1, -.1), lb constant: va = (0.04/3)/4, vb = 0, df = 3
    a = [2 * math.exp(d) for d in (0.1, -0.1, 0.1, -0.1)]
    b = [1.0] * 4
    r = unpaired_ratio(a, b)
    se = math.sqrt(0.04 / 3 / 4)
    assert r.ratio == pytest.approx(2.0)
    assert r.lo == pytest.approx(2 * math.exp(-3.182 * se))
    assert r.hi == pytest.approx(2 * math.exp(3.182 * se))
    assert r.rounds == 4 and r.paired is False


def test_unpaired_equal_variances_df():
    # equal variances and sizes (4 and 4): Welch df = 6 -> t = 2.447
    a = [2 * math.exp(d) for d in (0.1, -0.1, 0.1, -0.1)]
    b = [math.exp(d) for d in (0.1, -0.1, 0.1, -0.1)]
    r = unpaired_ratio(a, b)
    se = math.sqrt(2 * 0.04 / 3 / 4)
    assert r.ratio == pytest.approx(2.0)
    assert math.log(r.hi / r.ratio) == pytest.approx(2.447 * se)


def test_unpaired_edges():
    assert unpaired_ratio([], [1.0]) is None
    assert unpaired_ratio([1.0], [0.0, -1.0]) is None
    r = unpaired_ratio([2.0, 2.0, 2.0], [1.0, 1.0])
    assert (r.ratio, r.lo, r.hi) == pytest.approx((2.0, 2.0, 2.0)) and r.rounds == 2
    one = unpaired_ratio([3.0], [1.0, 1.1, 0.9])
    assert one.ratio == pytest.approx(3.0 / math.exp(statistics.fmean(math.log(x) for x in (1.0, 1.1, 0.9))))
    assert one.lo == 0.0 and one.hi == math.inf and one.rounds == 1


# -- Ratio.outcome ----------------------------------------------------------------------------------

@pytest.mark.parametrize("lo, hi, expected", [
    (0.90, 0.95, (-1, True)),          # a faster, clear
    (0.90, 1 - M - 1e-9, (-1, True)),  # just below 1 - m
    (0.90, 1 - M, (0, False)),         # touching 1 - m: not beyond it
    (1.05, 1.10, (1, True)),           # a slower
    (1 + M + 1e-9, 1.10, (1, True)),
    (1 + M, 1.10, (0, False)),
    (0.99, 1.01, (0, True)),           # inside the margin: a resolved tie
    (1 - M, 1 + M, (0, True)),         # edges included
    (1 - M - 1e-9, 1.01, (0, False)),  # straddles the lower edge
    (0.99, 1 + M + 1e-9, (0, False)),  # straddles the upper edge
    (0.95, 1.05, (0, False)),
    (0.0, math.inf, (0, False)),
])
def test_outcome(lo, hi, expected):
    r = Ratio(math.sqrt(lo * hi) if math.isfinite(hi) and lo > 0 else 1.0, lo, hi, 3, True)
    assert r.outcome(M) == expected


def test_outcome_depends_on_margin():
    r = Ratio(1.03, 1.025, 1.035, 5, True)
    assert r.outcome(0.02) == (1, True)
    assert r.outcome(0.04) == (0, True)
    assert r.outcome(0.03) == (0, False)
    f = Ratio(0.97, 0.965, 0.975, 5, True)
    assert f.outcome(0.02) == (-1, True)
    assert f.outcome(0.04) == (0, True)


def test_ratio_to_dict_rounds():
    d = Ratio(1.0123456, 0.9987654, 1.0261111, 6, False).to_dict()
    assert d == {"ratio": 1.01235, "lo": 0.99877, "hi": 1.02611, "rounds": 6, "paired": False}


# -- point_rounds / ratio_of / center ---------------------------------------------------------------

def test_point_rounds_pairs_round_ids():
    p = rpt("qkv-tp2-ub.te", [10.0, 11.0, 12.0], ids=[3, 5, 6])
    assert point_rounds(p) == {3: 10.0, 5: 11.0, 6: 12.0}
    # ids of another length than the values: positions
    p = p.with_(timing={"total_ms": p.timing["total_ms"].with_(round_ids=(1, 2))})
    assert point_rounds(p) == {0: 10.0, 1: 11.0, 2: 12.0}
    p = p.with_(timing={"total_ms": p.timing["total_ms"].without("round_ids")})
    assert point_rounds(p) == {0: 10.0, 1: 11.0, 2: 12.0}


def test_point_rounds_empty_cases():
    assert point_rounds(None) == {}
    assert point_rounds(rpt("qkv-tp2-ub.te", [10.0, 11.0], status="failed")) == {}
    assert point_rounds(MeasuredPoint("qkv-tp2-none", "failed")) == {}
    no_rounds = MeasuredPoint("qkv-tp2-none", "ok", timing={"total_ms": TimingSummary(median=1.0)})
    assert point_rounds(no_rounds) == {}
    p = rpt("qkv-tp2-ub.te", [10.0, 11.0])
    p = p.with_(timing={**p.timing, "fwd_ms": TimingSummary(median=4.0, rounds=(4.0, 4.5), round_ids=(0, 1))})
    assert point_rounds(p, "fwd_ms") == {0: 4.0, 1: 4.5}
    assert point_rounds(p, "bwd_ms") == {}


def test_ratio_of_paired_in_one_session():
    a = rpt("qkv-tp2-ub.te", {0: 11.0, 1: 13.2, 2: 8.8})
    b = rpt("qkv-tp2-none", {0: 10.0, 1: 12.0, 2: 8.0})
    r = ratio_of(a, b)
    assert r.paired and r.rounds == 3
    assert (r.ratio, r.lo, r.hi) == pytest.approx((1.1, 1.1, 1.1))


def test_ratio_of_unpaired_across_sessions_or_without_common_rounds():
    a = rpt("qkv-tp2-ub.te", {0: 11.0, 1: 13.2, 2: 8.8}, session="s1")
    b = rpt("qkv-tp2-none", {0: 10.0, 1: 12.0, 2: 8.0}, session="s2")
    r = ratio_of(a, b)
    assert not r.paired and r.hi / r.lo > 1.3      # the drift between rounds is in the interval
    assert r.ratio == pytest.approx(1.1)
    # one session, no round in common
    c = rpt("qkv-tp2-none", {5: 10.0, 6: 12.0, 7: 8.0}, session="s1")
    assert not ratio_of(a, c).paired
    # no session id on either: never paired
    a2, b2 = a.with_(session=None), b.with_(session=None)
    assert not ratio_of(a2, b2).paired
    # a failed side: nothing to compare
    assert ratio_of(a, rpt("qkv-tp2-none", [10.0], status="failed", session="s1")) is None
    assert ratio_of(a, None) is None


def test_center_is_geometric_mean():
    assert center(rpt("qkv-tp2-none", [1.0, 4.0, 16.0])) == pytest.approx(4.0)
    assert center(None) == math.inf
    assert center(rpt("qkv-tp2-none", [1.0], status="failed")) == math.inf


# -- session_state / should_stop ----------------------------------------------------------------------

def test_session_state_leader_losers_and_ties():
    pts = {
        "qkv-tp2-ub.te": rpt("qkv-tp2-ub.te", [10.0, 10.1, 9.9, 10.0]),
        "qkv-tp2-ub.te+dgrad.bulk.sm4": rpt("qkv-tp2-ub.te+dgrad.bulk.sm4", [11.0, 11.1, 10.9, 11.0]),
        "qkv-tp2-ub.te+dgrad.bulk.sm8": rpt("qkv-tp2-ub.te+dgrad.bulk.sm8", [10.02, 10.12, 9.92, 10.02]),
        "qkv-tp2-nocomm": rpt("qkv-tp2-nocomm", [5.0, 5.0, 5.0, 5.0]),       # not a contender
        "qkv-tp2-ub.te+fprop.ring": rpt("qkv-tp2-ub.te+fprop.ring", [1.0], status="failed"),
    }
    contenders = [c for c in pts if c != "qkv-tp2-nocomm"]
    st = session_state(pts, contenders, M)
    assert st.leader == "qkv-tp2-ub.te"
    assert set(st.ratios) == {"qkv-tp2-ub.te+dgrad.bulk.sm4", "qkv-tp2-ub.te+dgrad.bulk.sm8"}
    assert st.ratios["qkv-tp2-ub.te+dgrad.bulk.sm4"].ratio == pytest.approx(1.1, rel=1e-3)
    assert st.losers == ["qkv-tp2-ub.te+dgrad.bulk.sm4"]
    assert st.resolved == {"qkv-tp2-ub.te+dgrad.bulk.sm4": True, "qkv-tp2-ub.te+dgrad.bulk.sm8": True}
    assert st.unresolved == []


def test_session_state_without_points():
    st = session_state({}, ["a", "b"], M)
    assert st.leader is None and st.losers == [] and st.unresolved == []
    st = session_state({"qkv-tp2-none": rpt("qkv-tp2-none", [1.0], status="failed")}, ["qkv-tp2-none"], M)
    assert st.leader is None


def test_single_round_leaves_everyone_unresolved():
    pts = {"a": rpt("a", [10.0]), "b": rpt("b", [20.0])}
    st = session_state(pts, ["a", "b"], M)
    assert st.leader == "a" and st.unresolved == ["b"] and st.losers == []


def test_should_stop_rules():
    resolved = session_state({"a": rpt("a", [10.0, 10.0, 10.0]), "b": rpt("b", [12.0, 12.0, 12.0])}, ["a", "b"], M)
    assert resolved.unresolved == [] and resolved.losers == ["b"]
    assert should_stop(resolved, 2, 3, 8) == (False, "")     # never before min_rounds
    assert should_stop(resolved, 3, 3, 8) == (True, "resolved after 3 rounds")
    open_ = session_state({"a": rpt("a", [10.0, 10.4, 9.6]), "b": rpt("b", [10.5, 9.5, 10.2])}, ["a", "b"], M)
    assert open_.unresolved == ["b"]
    assert should_stop(open_, 3, 3, 8) == (False, "")
    assert should_stop(open_, 7, 3, 8) == (False, "")
    stop, why = should_stop(open_, 8, 3, 8)
    assert stop and "undecided" in why and "b" in why and "(8)" in why


# -- adaptive sessions on synthetic rounds --------------------------------------------------------------

def adaptive(true_ms, noise, seed, min_rounds=3, max_rounds=8, margin=M, drift_sd=0.03, futility=False):
    """Launcher.session's loop on synthetic rounds: each round multiplies every member by one common
    drift factor (the machine) and by its own noise; resolved (and with ``futility`` futile) contenders
    drop out after min_rounds."""
    rng = random.Random(seed)
    rounds = {c: {} for c in true_ms}
    active, r = list(true_ms), 0
    while active:
        common = math.exp(rng.gauss(0, drift_sd))
        for c in rotation(active, r):
            rounds[c][r] = true_ms[c] * common * math.exp(rng.gauss(0, noise))
        r += 1
        points = {c: rpt(c, rs) for c, rs in rounds.items() if rs}
        state = session_state(points, list(true_ms), margin, leader_among=active,
                              budget=max_rounds if futility else None)
        stop, why = should_stop(state, r, min_rounds, max_rounds)
        if stop:
            return state, r, why, rounds
        if r >= min_rounds:
            active = measured_next(state, active)
    raise AssertionError("loop ended without a stop")


A, B, C = "qkv-tp2-ub.te", "qkv-tp2-ub.te+dgrad.bulk.sm4", "qkv-tp2-ub.te+dgrad.bulk.sm8"


@pytest.mark.parametrize("seed", range(10))
def test_clear_difference_resolves_at_min_rounds(seed):
    state, r, why, _ = adaptive({A: 10.0, B: 11.0}, 0.005, seed)
    assert r == 3 and why == "resolved after 3 rounds"
    assert state.leader == A and state.losers == [B]
    assert 1.07 < state.ratios[B].lo and state.ratios[B].hi < 1.13


@pytest.mark.parametrize("seed", range(10))
def test_small_difference_resolves_as_a_tie(seed):
    state, r, why, _ = adaptive({A: 10.0, B: 10.03}, 0.003, seed)
    assert r <= 5 and why.startswith("resolved")
    assert state.losers == [] and state.unresolved == []
    other = B if state.leader == A else A
    assert state.ratios[other].outcome(M) == (0, True)
    assert 1 - M <= state.ratios[other].lo and state.ratios[other].hi <= 1 + M


def test_tie_under_drift_needs_pairing():
    """3% drift between rounds: paired rounds resolve the tie, the same values unpaired cannot."""
    state, r, _, rounds = adaptive({A: 10.0, B: 10.03}, 0.003, 0, drift_sd=0.03)
    u = unpaired_ratio(list(rounds[A].values()), list(rounds[B].values()))
    assert u.outcome(M) == (0, False)
    assert state.resolved and all(state.resolved.values())


def test_near_margin_difference_stays_undecided_to_the_budget():
    outcomes = [adaptive({A: 10.0, B: 10.18}, 0.02, seed) for seed in range(20)]
    undecided = [o for o in outcomes if o[1] == 8 and "undecided" in o[2]]
    assert len(undecided) >= 16   # an interval at 1.8% +- 2% noise rarely clears a 2% margin
    state, r, why, _ = outcomes[0]
    assert r == 8 and why == f"round budget (8) spent; undecided: {B}"
    assert state.unresolved == [B] and state.losers == []
    assert all(o[0].losers == [] for o in undecided)


def test_resolved_loser_drops_out_while_a_close_one_runs_on():
    state, r, why, rounds = adaptive({A: 10.0, B: 12.0, C: 10.18}, 0.02, 0)
    assert r == 8 and "undecided" in why and C in why
    assert len(rounds[B]) == 3 and len(rounds[A]) == 8 and len(rounds[C]) == 8
    assert B in state.losers


# -- futility stop -------------------------------------------------------------------------------------

def ratio_over(ms_a, ms_b):
    return paired_ratio(dict(enumerate(ms_a)), dict(enumerate(ms_b)))


def test_could_clear_projects_the_mean_and_spread_to_the_budget():
    r = ratio_over([10.15, 10.25, 10.05, 10.15], [10.0] * 4)       # +1.5% +- 0.8% per round
    assert r.outcome(M) == (0, False)
    assert not could_clear(r, M, None, 6)     # at 6 rounds the interval still straddles 1.02
    assert could_clear(r, M, None, 20)        # at 20 it would lie inside the 2% tie band
    assert could_clear(r, 0.01, M, 12)        # a 1% win margin: lo would pass 1.01 by round 12


def test_could_clear_gives_no_verdict_it_cannot_back():
    three = ratio_over([10.15, 10.25, 10.05], [10.0] * 3)
    two = ratio_over([10.15, 10.25], [10.0] * 2)
    assert FUTILITY_MIN_ROUNDS == 3
    assert could_clear(two, M, None, 6)       # one degree of freedom: never futile
    assert not could_clear(three, M, None, 6)
    assert could_clear(three, M, None, 3)     # no round left to add: nothing to save
    assert could_clear(Ratio(1.015, 0.0, math.inf, 4, True), M, None, 6)


def test_futile_contenders_stop_the_session_before_the_budget():
    pts = {"a": rpt("a", [10.0] * 4), "b": rpt("b", [10.15, 10.25, 10.05, 10.15]),
           "c": rpt("c", [12.0] * 4)}
    without = session_state(pts, ["a", "b", "c"], M)
    assert without.unresolved == ["b"] and without.futile == [] and without.open == ["b"]
    assert should_stop(without, 4, 2, 6) == (False, "")
    st = session_state(pts, ["a", "b", "c"], M, budget=6)
    assert st.futile == ["b"] and st.open == [] and st.losers == ["c"]
    stop, why = should_stop(st, 4, 2, 6)
    assert stop and why.startswith("futile after 4 rounds") and why.endswith("undecided: b")
    assert should_stop(st, 1, 2, 6) == (False, "")                  # never before min_rounds
    assert should_stop(st, 6, 2, 6)[1].startswith("round budget (6) spent")
    assert session_state(pts, ["a", "b", "c"], M, budget=20).futile == []


def test_measured_next_keeps_the_leader_open_contenders_references_and_always():
    pts = {"a": rpt("a", [10.0] * 4), "b": rpt("b", [10.15, 10.25, 10.05, 10.15]), "c": rpt("c", [12.0] * 4),
           "d": rpt("d", [10.05, 10.25, 9.85, 10.05]), "n": rpt("n", [11.0] * 4), "x": rpt("x", [12.0] * 4)}
    st = session_state(pts, ["a", "b", "c", "d"], M, budget=6)
    assert st.futile == ["b"] and st.open == ["d"]
    active = ["a", "b", "c", "d", "n", "x"]
    assert measured_next(st, active, {"n"}) == ["a", "d", "n"]
    assert measured_next(st, active, {"n"}, always=["x"]) == ["a", "d", "n", "x"]
    assert measured_next(session_state(pts, ["a", "b", "c", "d"], M), active) == ["a", "b", "d"]


def test_futility_ends_near_margin_comparisons_early_with_the_same_outcome():
    """1.8% apart at 2% noise: the budget rarely clears it; the futility stop says so sooner."""
    for seed in range(20):
        full = adaptive({A: 10.0, B: 10.18}, 0.02, seed)
        early = adaptive({A: 10.0, B: 10.18}, 0.02, seed, futility=True)
        assert early[1] <= full[1]
        if early[1] < full[1]:
            assert early[2].startswith("futile") and len(early[0].unresolved) == 1 and early[0].losers == []
    stops = [adaptive({A: 10.0, B: 10.18}, 0.02, seed, futility=True)[1] for seed in range(20)]
    assert statistics.mean(stops) < 6


@pytest.mark.parametrize("seed", range(10))
def test_futility_leaves_clear_outcomes_alone(seed):
    assert adaptive({A: 10.0, B: 11.0}, 0.005, seed, futility=True)[1:3] == (3, "resolved after 3 rounds")
    state, r, why, _ = adaptive({A: 10.0, B: 10.03}, 0.003, seed, futility=True)
    assert why.startswith("resolved") and state.unresolved == []


# -- drift ------------------------------------------------------------------------------------------

def test_drift():
    assert drift([10.0, 10.5, 10.2]) == pytest.approx(0.05)
    assert drift([10.0, 10.0]) == 0.0
    assert drift([10.0]) is None
    assert drift([]) is None
    assert drift([None, 0.0, 10.0, math.inf, 11.0]) == pytest.approx(0.1)
    assert drift([None, 10.0]) is None
