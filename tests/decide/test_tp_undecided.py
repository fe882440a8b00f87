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
