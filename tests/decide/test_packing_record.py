"""The packing decision from recorded packed sessions (decide.packing, issue 53): each session's rounds pair with
its own native points only, worked by hand on a machine whose every time is proportional to the tokens computed
on (then what the padding costs is the padded tokens' ratio, summarize's, and what overlap saves is the set's own
factor), with a drift between rounds and sessions that must cancel; members that failed are named and their T
left out."""
from __future__ import annotations

import pytest

from tptune.decide.packing import packing_record, read_rounds
from tptune.measure.preflight import resolve_here
from tptune.packing.rules import summarize
from tptune.packing.spec import PackingSpec
from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import Session
from tptune.search.packed import capacity_cases, native_points, native_cases

from conftest import base_config

PACKING = {"lengths": {"histogram": {"edges": [8, 64, 160, 193], "counts": [600, 300, 100]}}, "rule": "verl",
           "max_token_len": 192, "seqs_per_step": 16, "forward_passes": 2}
K, FWD, SET = 0.5, 0.3, 0.9           # ms a token; forward-only's share of fwd+bwd; the set's time over none's
DRIFT = {256: (1.0, 2.0, 1.3), 384: (0.7, 1.6, 1.1)}   # each session's rounds: the machine's speed moves


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pool = tmp_path_factory.mktemp("pool")
    s = resolve_here(base_config(pool, tp_sizes=[2], workload={"packing": PACKING}), check_hardware=False)
    spec = PackingSpec.from_config(s.config)
    return s, spec, spec.load("."), native_points(s, spec, spec.load("."), 2)


def point(case: str, tokens: int, drift, factor: float = 1.0, status: str = "ok") -> MeasuredPoint:
    ms = [K * tokens * d * factor for d in drift]
    ids = list(range(len(ms)))
    return MeasuredPoint.from_dict({"case": case, "status": status, "timing": {
        "total_ms": {"median": sorted(ms)[len(ms) // 2], "rounds": ms, "round_ids": ids},
        "fwd_only_ms": {"median": FWD * sorted(ms)[len(ms) // 2], "rounds": [FWD * x for x in ms], "round_ids": ids}}}
        if status == "ok" else {"case": case, "status": status, "timing": {}, "error": {"kind": "x", "message": "x"}})


def session(cap: int, native, settings, failed=()) -> Session:
    native_ref = [[t, k] for k, (t, _) in enumerate(native, start=1)]
    cases = capacity_cases(2, cap, settings)
    pts = {cases["none"].id: point(cases["none"].id, cap, DRIFT[cap]),
           cases["set"].id: point(cases["set"].id, cap, DRIFT[cap], SET)}
    pts |= {c.id: point(c.id, t, DRIFT[cap]) for t, c in native_cases(2, native_ref).items()}
    pts = {cid: (point(cid, 1, (), status="failed") if cid in failed else p) for cid, p in pts.items()}
    rec = {"session": f"layer/tp2/pack{cap}", "rounds": 3, "stop": "round budget (3) spent",
           "settings": {"packing": {"capacity": cap, "native": native_ref}}, "runs": {}}
    return Session(f"layer/tp2/pack{cap}", rec, pts)


SETTINGS = {"set": "chunked.n2", "preset": None}
PLAN = {"tp": 2, "why": "test", "capacities": [256, 384], "settings": SETTINGS}


def test_each_capacity_pairs_with_its_own_sessions_rounds_worked_by_hand(run):
    s, spec, lengths, native = run
    assert [t for t, _ in native] == sorted({t for t, _ in native}) and len(native) == 3
    sessions = {cap: session(cap, native, SETTINGS) for cap in (256, 384)}
    rec, d = packing_record(s, spec, lengths, PLAN, sessions, None, None)
    padded_native = summarize(spec.native_steps(lengths, 2))["padded_per_step"]
    by_cap = {c.capacity: c for c in d.results}
    for cap in (256, 384):
        r = by_cap[cap]
        cost = summarize(spec.fill_steps(lengths, cap))["padded_per_step"] / padded_native
        # the drift cancels round by round: every interval is its ratio (no spread), paired over 3 rounds
        assert r.padding_cost.ratio == pytest.approx(cost) and r.padding_cost.hi - r.padding_cost.lo < 1e-9
        assert r.overlap.ratio == pytest.approx(SET) and r.vs_native.ratio == pytest.approx(SET * cost)
        assert r.vs_native.rounds == 3 and r.vs_native.paired and r.vs_native.hi - r.vs_native.lo < 1e-9
    best = min(d.results, key=lambda r: r.vs_native.ratio)
    assert d.capacity == rec["capacity"] == best.capacity
    assert d.verdict == rec["verdict"] == ("on" if best.vs_native.ratio < 1 else "off")
    assert rec["sentence"] == d.sentence and f"T = {best.capacity}" in d.sentence
    assert rec["native"]["fit"] == {"degree": 1, "residual": 0.0, "outside": pytest.approx(d.fit_outside, abs=1e-5),
                                    "tokens": [t for t, _ in native]}
    for row in rec["rows"]:
        assert row["ratios"]["set/none"]["ratio"] == pytest.approx(SET)
        assert row["ratios"]["set/none forward-only"]["ratio"] == pytest.approx(SET)
        assert row["rounds"] == 3 and row["bins_per_step"] > 0 and 0 < row["padding_share"] < 1
    assert rec["memory"]["ub_bytes"]["256"] < rec["memory"]["ub_bytes"]["384"] and not rec["problems"]


def test_a_capacity_whose_set_failed_is_left_out_and_named(run):
    s, spec, lengths, native = run
    set_256 = capacity_cases(2, 256, SETTINGS)["set"].id
    native_384 = native_cases(2, [[native[0][0], 1]])[native[0][0]].id
    sessions = {256: session(256, native, SETTINGS, failed=(set_256,)),
                384: session(384, native, SETTINGS, failed=(native_384,))}
    rec, d = packing_record(s, spec, lengths, PLAN, sessions, None, None)
    assert [c.capacity for c in d.results] == [384] and d.capacity == 384
    assert any(set_256 in p for p in rec["problems"]) and any("T = 256 left out" in p for p in rec["problems"])
    assert any(native_384 in p for p in rec["problems"])
    # the 384 session's first native point failed: its fit has the other two (still a line), the 256 session's three
    assert rec["native"]["fit"]["degree"] == 1
    # the set at T computed otherwise than no overlap on packed input: never the answer
    wrong = session(384, native, SETTINGS)
    set_384 = capacity_cases(2, 384, SETTINGS)["set"].id
    wrong.points[set_384] = wrong.points[set_384].with_(correctness={"ok": False})
    rec, d = packing_record(s, spec, lengths, PLAN, {256: session(256, native, SETTINGS), 384: wrong}, None, None)
    assert [c.capacity for c in d.results] == [256] and any("failed its numerics" in p for p in rec["problems"])


def test_one_native_token_count_fits_a_constant_and_nothing_measured_says_why(run):
    s, spec, lengths, native = run
    one = [native[1]]
    rounds = read_rounds({256: session(256, one, SETTINGS)}, 2, SETTINGS, 2, 0.02)
    assert rounds.native.degree == 0 and set(rounds.times) == {256}
    rec, d = packing_record(s, spec, lengths, {**PLAN, "tp": None, "why": "no TP of 2 or more"}, {}, None, None)
    assert d is None and rec["verdict"] == "unmeasured" and rec["capacity"] is None
    assert rec["sentence"] == "No packed block was measured: no TP of 2 or more."
