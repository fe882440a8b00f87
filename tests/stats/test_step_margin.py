"""decision.step_margin: a search step between two values of one knob (paired rounds of one session) wins
beyond the step margin and ties within the noise floor; the TP point and unpaired comparisons keep the
floor; runs recorded before the key existed replay with the floor for both."""
import math
import types

from tptune.search import bisect
from tptune.settings.blocks import Decision, Search
from tptune.stats.noise import compare_points
from tptune.stats.rounds import Ratio, session_state

from test_rounds import rpt

FLOOR, STEP = 0.02, 0.01


def test_ratio_outcome_wins_beyond_the_margin_and_ties_within_the_tie_margin():
    # x2, qkv wgrad 4 vs 8 SMs (stability v3 rep3): clear of 1%, straddles 2%
    r = Ratio(1.02424, 1.01971, 1.0288, 6, True)
    assert r.outcome(FLOOR) == (0, False)               # one margin: undecided -> the cheaper value
    assert r.outcome(STEP, FLOOR) == (1, True)          # a (4 SMs) slower beyond 1%: 8 kept
    assert Ratio(0.975, 0.97, 0.985, 4, True).outcome(STEP, FLOOR) == (-1, True)
    near = Ratio(1.005, 0.992, 1.018, 4, True)          # inside +-2%, not clear of 1%: a resolved tie
    assert near.outcome(STEP, FLOOR) == (0, True)
    assert near.outcome(STEP) == (0, False)             # tie margin defaults to the margin
    wide = Ratio(1.01, 0.97, 1.05, 2, True)
    assert wide.outcome(STEP, FLOOR) == (0, False)


def _paired(ratio, n=6, base=3.5, jitter=0.002, session="qkv/tp2/wgrad.bulk/step2"):
    """Two points of one session whose per-round ratio is ``ratio`` (+- a deterministic jitter)."""
    a, b = {}, {}
    for r in range(n):
        j = jitter * math.sin(r * 1.7)
        b[r] = base * (1 + 0.01 * math.cos(r))
        a[r] = b[r] * ratio * (1 + j)
    return rpt("qkv-tp2-ub.te+wgrad.bulk.sm4", a, session=session), rpt("qkv-tp2-ub.te+wgrad.bulk.sm8", b,
                                                                        session=session)


def test_compare_points_win_applies_to_paired_rounds_only():
    a, b = _paired(1.015)
    plain = compare_points(a, b, floor=FLOOR, tie="a")
    assert (plain.outcome, plain.winner, plain.resolved) == (0, "a", True)   # within 2%: a tie, a kept
    step = compare_points(a, b, floor=FLOOR, tie="a", win=STEP)
    assert (step.outcome, step.winner, step.resolved) == (1, "b", True)
    d = step.to_dict()
    assert d["margin"] == STEP and d["tie_margin"] == FLOOR and "tie_margin" not in plain.to_dict()
    # the same values from two sessions: unpaired, the floor decides whatever ``win`` says
    a2 = a.with_(session="other")
    unp = compare_points(a2, b, floor=FLOOR, tie="a", win=STEP)
    assert unp.ratio is not None and not unp.ratio.paired
    assert unp.margin == FLOOR and unp.outcome == 0 and unp.tie_margin is None


def test_bisection_keeps_the_faster_value_beyond_the_step_margin():
    """SM counts [1, 2, 4, 8, 16]: 4 is 1.5% slower than 8 in every round, 8 ties 16 and 2 ties 4, 1 is
    slow. One 2% margin calls 4 vs 8 a tie and ends at the cheap side (2); the step margin keeps 8."""
    cands = [1, 2, 4, 8, 16]
    pairs = {(4, 8): _paired(1.015, session="s0"), (8, 16): _paired(1.0, session="s1"),
             (2, 4): _paired(1.0, session="s2"), (1, 2): _paired(1.2, session="s3")}
    assert bisect.next_points(cands, {}, floor=FLOOR, pairs=pairs) == []
    assert bisect.result(cands, {}, floor=FLOOR, pairs=pairs)[0] == 2
    best, path = bisect.result(cands, {}, floor=FLOOR, pairs=pairs, win=STEP)
    assert best == 8 and [p["compared"] for p in path] == [[4, 8], [8, 16]]
    assert path[-1]["comparison"]["margin"] == STEP and path[-1]["comparison"]["tie_margin"] == FLOOR


def test_session_state_resolves_with_the_tie_margin():
    a, b = _paired(1.006, n=4, jitter=0.008)
    pts = {a.case: a, b.case: b}
    r = next(iter(session_state(pts, list(pts), STEP).ratios.values()))
    assert 0.98 < r.lo < 0.99 or 1.01 < r.hi < 1.02
    st = session_state(pts, list(pts), STEP)
    assert st.unresolved                                 # within 2%, not within 1%: more rounds
    st2 = session_state(pts, list(pts), STEP, tie_margin=FLOOR)
    assert not st2.unresolved and not st2.losers


def test_step_margins_from_the_config_and_for_recorded_runs():
    s = Decision.from_dict({"noise_floor": 0.02, "step_margin": 0.01})
    assert s.step_margins == (0.01, 0.02)
    old = Decision.from_dict({"noise_floor": 0.03})   # recorded before the key
    assert old.step_margins == (0.03, 0.03)


def test_default_config_sets_the_step_margin_and_the_schema_checks_it(tmp_path):
    import pytest

    from tptune.errors import ConfigError
    from tptune.measure.preflight import resolve_here
    from tptune.settings.resolve import load_config_files

    from conftest import ROOT
    cfg = load_config_files(str(ROOT / "config" / "config.yaml"))
    assert cfg["decision"]["step_margin"] == 0.01 < cfg["decision"]["noise_floor"]
    cfg["decision"]["step_margin"] = -0.01
    with pytest.raises(ConfigError, match="step_margin"):
        resolve_here(cfg, base_dir=ROOT, check_hardware=False)


def _step(compared, kept, ratio, lo, hi, outcome, rounds=4):
    return {"compared": compared, "kept": kept,
            "comparison": {"outcome": outcome, "ratio": {"ratio": ratio, "lo": lo, "hi": hi, "rounds": rounds,
                                                         "paired": True}}}


def test_runner_up_is_the_last_value_compared_with_the_best_inside_the_floor():
    from tptune.search.steps import runner_up

    # x2 qkv wgrad.bulk (this session's rep2): 8 kept at the 1% step margin, inside the 2% floor
    path = [_step([8, 16], [1, 8], 0.994, 0.984, 1.005, 0), _step([2, 4], [4, 8], 1.262, 1.204, 1.323, 1),
            _step([4, 8], [8, 8], 1.0138, 1.0108, 1.0169, 1)]
    assert runner_up(path, 8, FLOOR) == 4
    # the best cleared the floor in its last step: no runner-up
    clear = path[:2] + [_step([4, 8], [8, 8], 1.029, 1.0205, 1.038, 1)]
    assert runner_up(clear, 8, FLOOR) is None
    # qkv dgrad.bulk: best 2 last met 1 (15% slower): none, though 2 tied 4 a step before
    dg = [_step([8, 16], [1, 8], 0.996, 0.993, 0.999, 0), _step([2, 4], [1, 2], 1.003, 0.990, 1.016, 0),
          _step([1, 2], [2, 2], 1.145, 1.135, 1.156, 1)]
    assert runner_up(dg, 2, FLOOR) is None
    # an interval without an upper end (one round) is undecided: near
    assert runner_up([_step([1, 2], [1, 1], 1.0, 0.9, None, 0, rounds=1)], 1, FLOOR) == 2
    assert runner_up([], 4, FLOOR) is None


def test_tuned_combinations_take_the_runner_ups():
    from tptune.search.steps import tuned_cases

    search = Search.from_dict({"mode": "bisect"})
    s = types.SimpleNamespace(backend="te", op=lambda op: types.SimpleNamespace(search=search))
    results = {"fprop.ring_exchange": {"best_case": "qkv-tp2-ub.te+fprop.ring"},
               "dgrad.bulk": {"best_case": "qkv-tp2-ub.te+dgrad.bulk.sm2"},
               "wgrad.bulk": {"best_case": "qkv-tp2-ub.te+wgrad.bulk.sm4",
                              "runner_up_case": "qkv-tp2-ub.te+wgrad.bulk.sm8"}}
    ids = [c.id for c in tuned_cases(s, "qkv", 2, results)]
    assert ids == ["qkv-tp2-ub.te+fprop.ring+dgrad.bulk.sm2+wgrad.bulk.sm4",
                   "qkv-tp2-ub.te+fprop.ring+dgrad.bulk.sm2+wgrad.bulk.sm8"]
    del results["wgrad.bulk"]["runner_up_case"]
    assert len(tuned_cases(s, "qkv", 2, results)) == 1
