"""The model's overlap rule states its interval (decide.tp.settle_undecided): a hidden share whose interval
straddles min_hidden_fraction is undecided, whichever side its point estimate lies on; then the next TP's
scaling, the memory floor, or the cheaper layout decides, and the record says which."""
import copy

import pytest

from tptune.decide.tp import apply_floor, settle_undecided


def _hide(passed=True, outcome=-1, tp=2, need=0.25):
    return {"rule": "hides_communication", "tp": tp, "passed": passed, "hidden_fraction": 0.3,
            "min_hidden_fraction": need, "comparison": {"outcome": outcome}, "reason": "hides 30%"}


def _eff(lo, hi, fault=None):
    return {"value": (lo + hi) / 2, "lo": lo, "hi": hi, "fault": fault}


@pytest.mark.parametrize("lo,hi,rule_tp", [(0.30, 0.60, 2), (0.05, 0.20, 1), (0.25, 0.40, 2)])
def test_an_interval_on_one_side_of_the_line_leaves_the_decision_as_it_was(lo, hi, rule_tp):
    ev = [_hide(passed=rule_tp > 1)]
    before = copy.deepcopy(ev)
    assert settle_undecided(rule_tp, ev, _eff(lo, hi), {}) == rule_tp
    assert ev == before


def test_a_straddling_interval_without_memory_or_scaling_keeps_the_cheaper_layout():
    ev = [_hide(passed=True)]
    assert settle_undecided(2, ev, _eff(0.15, 0.37), {"effective_tp": None}) == 1
    assert ev[0]["undecided"] and ev[0]["passed"] is None and ev[0]["decided_by"] == "cheaper"
    assert "straddles 25%" in ev[0]["undecided_why"] and "timing.max_rounds" in ev[0]["undecided_why"]


def test_a_point_below_the_line_with_a_straddling_interval_is_undecided_too():
    ev = [_hide(passed=False)]
    assert settle_undecided(1, ev, _eff(0.10, 0.40), {}) == 1
    assert ev[0]["undecided"] and ev[0]["decided_by"] == "cheaper"


def test_the_memory_floor_decides_a_straddling_rule_where_the_model_needs_tp():
    ev = [_hide(passed=True)]
    floor = {"effective_tp": 2, "why": "no TP below 2 fits"}
    tp = settle_undecided(2, ev, _eff(0.23, 0.59), floor)
    assert tp == 1 and ev[0]["decided_by"] == "memory_floor"
    raised, rec = apply_floor(tp, {**floor, "measured_tps": [2]}, "model")
    assert raised == 2 and rec["passed"] is False


def test_the_next_tps_scaling_decides_where_it_was_measured_and_passed():
    ev = [_hide(passed=True), {"rule": "scaling", "from_tp": 2, "to_tp": 4, "passed": True}]
    assert settle_undecided(4, ev, _eff(0.10, 0.50), {}) == 4
    assert ev[0]["decided_by"] == "scaling"


@pytest.mark.parametrize("case", ["no_beat", "fault", "no_interval"])
def test_no_fraction_to_judge_leaves_the_rule_alone(case):
    ev = [_hide(passed=False, outcome=0 if case == "no_beat" else -1)]
    eff = _eff(0.1, 0.5, fault={"ratio": 1.1} if case == "fault" else None)
    if case == "no_interval":
        eff["lo"] = eff["hi"] = None
    assert settle_undecided(1, ev, eff, {}) == 1 and "undecided" not in ev[0]


def _across(lo=0.954, hi=0.986, resolved=False, outcome=0):
    h = _hide(passed=False, outcome=outcome)
    h.update({"margin": 0.02, "comparison": {"outcome": outcome, "resolved": resolved,
                                             "ratio": {"ratio": (lo + hi) / 2, "lo": lo, "hi": hi, "rounds": 2}}})
    return h


def test_the_ops_against_no_overlap_across_the_margin_is_undecided_and_the_measured_scaling_decides():
    """4x H200 rep2: the ops summed 0.970 [0.954, 0.986] of no overlap: faster, perhaps beyond the 2% margin.
    The rule used to read that as 'does not beat' (TP 1) where rep1's 0.967 [0.962, 0.972] passed; now it is
    undecided, and the next TP's scaling, measured (model_scaling), decides as in rep1."""
    ev = [_across()]
    steps = [{"rule": "scaling", "from_tp": 2, "to_tp": 4, "passed": True},
             {"rule": "node_bound", "tp": 8, "passed": False}]
    assert settle_undecided(1, ev, _eff(0.30, 1.0), {}, scaling=(4, steps)) == 4
    assert ev[0]["undecided"] and ev[0]["decided_by"] == "scaling" and ev[0]["passed"] is None
    assert "0.970 [0.954, 0.986]" in ev[0]["undecided_why"] and "across the 2% margin" in ev[0]["undecided_why"]
    assert [e["rule"] for e in ev[1:]] == ["scaling", "node_bound"] and all(e["after_undecided"] for e in ev[1:])
    # the same without a measured next TP: the memory floor, then the cheaper layout
    ev = [_across()]
    assert settle_undecided(1, ev, _eff(0.30, 1.0), {"effective_tp": 4}) == 1 and ev[0]["decided_by"] == "memory_floor"
    ev = [_across()]
    assert settle_undecided(1, ev, _eff(0.30, 1.0), {}, scaling=(2, [{"rule": "scaling", "from_tp": 2,
                                                                      "passed": False}])) == 1
    assert ev[0]["decided_by"] == "cheaper" and len(ev) == 1


@pytest.mark.parametrize("lo,hi,resolved,eff_hi", [(0.985, 0.995, True, 1.0),    # a resolved tie: within the margin
                                                   (0.990, 1.010, False, 1.0),   # cannot beat it beyond the margin
                                                   (0.954, 0.986, False, 0.20)])  # hides too little for sure
def test_what_is_not_across_a_line_stays_as_the_rule_read_it(lo, hi, resolved, eff_hi):
    ev = [_across(lo, hi, resolved)]
    before = copy.deepcopy(ev)
    assert settle_undecided(1, ev, _eff(0.05, eff_hi), {}, scaling=(4, [{"rule": "scaling", "from_tp": 2,
                                                                          "passed": True}])) == 1
    assert ev == before


def test_the_three_4x_h200_runs_now_give_one_reason_for_tp_4():
    """results/tp24-llama3-70b-h200x4: rep1 by the rule, rep2 and rep3 undecided at TP 2 and decided by the
    measured TP 2 -> 4 scaling (before: 'the overlap rule alone says TP=1', then the memory floor)."""
    import json
    from pathlib import Path

    base = Path(__file__).parents[2] / "results" / "tp24-llama3-70b-h200x4"
    rules = []
    for k in (1, 2, 3):
        meta = json.loads((base / f"rep{k}" / "decisions.json").read_text())["meta"]
        assert meta["model_tp"] == 4 and meta["model_tp_rule"] == 4
        hide = next(e for e in meta["model_tp_evidence"] if e["rule"] == "hides_communication")
        rules.append(hide.get("decided_by", "passed"))
    assert rules == ["passed", "scaling", "scaling"]
