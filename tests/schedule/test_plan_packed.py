"""The prediction before measuring counts the packed block sessions (workload.packing, issue 53): one per
capacity T at the largest TP, each a block's member-rounds scaled by its tokens, after every layer session; the
progress line's sessions ahead name them too (packing/plan.json's once the decisions made it)."""
from __future__ import annotations

import json

import pytest

from tptune.measure.preflight import resolve_here
from tptune.records.run_dir import RunDir
from tptune.schedule import measured as ms
from tptune.schedule.plan_estimate import estimate, planned_sessions
from tptune.schedule.wall_fit import load_table
from tptune.search.ahead import sessions_ahead

from conftest import ROOT, base_config

PACKING = {"lengths": str(ROOT / "config/packing/rl-bimodal.txt"), "rule": "verl", "max_token_len": 1536,
           "seqs_per_step": 16, "forward_passes": 2}


@pytest.fixture
def runs(pool_dir):
    plain = resolve_here(base_config(pool_dir, tp_sizes=[2]), check_hardware=False)
    packing = resolve_here(base_config(pool_dir, tp_sizes=[2], workload={"packing": PACKING}), check_hardware=False)
    return plain, packing


def test_the_prediction_counts_a_packed_session_per_capacity_after_the_blocks(runs):
    plain, packing = runs
    a, b = estimate(plain, 2), estimate(packing, 2)
    extra = [x for x in b.sessions if x not in a.sessions]
    assert [x.name for x in extra] == ["layer/tp2/pack1536", "layer/tp2/pack3072"]
    assert [x.members for x in extra] == [5, 5]        # none and the set at T, three native points
    block = next(x for x in a.sessions if x.name == "layer/tp2")
    # a member-round of tokens T costs T / (seq x mbs) of a block's and a third more for the forward-only timing
    assert extra[0].seconds / extra[0].members > block.seconds / block.members
    assert extra[1].seconds > extra[0].seconds
    assert b.predicted_wall_s > a.predicted_wall_s + sum(x.seconds for x in extra) * 0.9
    assert any("2 packed block sessions" in n and "TP 2" in n for n in b.notes)
    sessions, _ = planned_sessions(packing, load_table())
    assert ms.dependencies(sessions)["layer/tp2/pack1536"][0] == ("layer/tp2",)


def test_the_sessions_ahead_are_the_plans_once_it_is_written(runs, tmp_path):
    _, packing = runs
    run = RunDir(tmp_path / "run")
    ahead = sessions_ahead(packing, run).sessions
    assert {"layer/tp2/pack1536", "layer/tp2/pack3072"} <= ahead
    run.packing_dir.mkdir(parents=True)
    run.packing_plan_json.write_text(json.dumps({"tp": 2, "capacities": [3072], "sessions": ["layer/tp2/pack3072"]}))
    ahead = sessions_ahead(packing, run).sessions
    assert "layer/tp2/pack3072" in ahead and "layer/tp2/pack1536" not in ahead
