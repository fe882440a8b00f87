import math

import pytest

from tptune.records.point_fields import make_point

from tptune.search.bisect import next_points, result

SMS = [1, 2, 4, 8, 16, 24, 32]


def pt(value, ms):
    if ms is None:
        return make_point(f"v{value}", status="failed")
    return make_point(f"v{value}", [ms * (1 + d) for d in (-0.001, 0.0, 0.001, 0.0005, -0.0005)])


def run(cands, curve):
    """Drive the state machine to the end; return (best, path, measured order, steps)."""
    measured, order, steps = {}, [], 0
    while todo := next_points(cands, measured):
        assert 1 <= len(todo) <= 2 and all(v not in measured for v in todo)
        steps += 1
        for v in todo:
            measured[v] = pt(v, curve[cands.index(v)])
            order.append(v)
    best, path = result(cands, measured)
    return best, path, order, steps


def v_curve(n, at):
    return [10.0 + 1.5 * abs(i - at) for i in range(n)]


@pytest.mark.parametrize("at", range(len(SMS)))
def test_finds_the_minimum_of_v_curves(at):
    best, _, order, _ = run(SMS, v_curve(len(SMS), at))
    assert best == SMS[at]
    assert len(order) <= 2 * math.ceil(math.log2(len(SMS)))


def test_skewed_unimodal_curves():
    assert run(SMS, [30, 20, 14, 11, 10, 10.6, 12])[0] == 16
    assert run([2, 4, 8], [9.0, 7.0, 8.0])[0] == 4


def test_edges_monotone():
    assert run(SMS, [10.0 - 0.8 * i for i in range(7)])[0] == 32
    assert run(SMS, [10.0 + 0.8 * i for i in range(7)])[0] == 1


@pytest.mark.parametrize("n", range(1, 18))
def test_point_count_bound_for_every_length_and_minimum(n):
    cands = list(range(n))
    bound = max(1, 2 * math.ceil(math.log2(n)))
    for at in range(n):
        best, path, order, steps = run(cands, v_curve(n, at))
        assert best == at
        assert len(order) <= bound
        # a step whose two points were measured earlier needs no new measuring round
        assert steps <= max(1, len(path)) and len(path) <= math.ceil(math.log2(n))


def test_ties_go_to_fewer_sms():
    assert run(SMS, [10.0] * 7)[0] == 1
    # beyond 2 SMs nothing improves by more than the 2% floor
    assert run(SMS, [12.0, 10.0, 9.9, 9.85, 9.8, 9.8, 9.75])[0] == 2


def test_failed_points_count_as_infinitely_slow():
    # descending curve whose 32-SM point fails: 24 wins
    assert run(SMS, [16, 15, 14, 13, 12, 11, None])[0] == 24
    # 1 SM fails (e.g. a hang): the minimum at 4 is still found
    assert run(SMS, [None, 11, 10, 11, 12, 13, 14])[0] == 4


def test_all_failed_returns_the_cheapest():
    assert run(SMS, [None] * 7)[0] == 1


def test_resume_from_partial_state_asks_only_for_missing_points():
    curve = v_curve(7, 5)
    measured = {v: pt(v, curve[SMS.index(v)]) for v in (8,)}         # crashed half-way through step 1
    assert next_points(SMS, measured) == [16]
    measured[16] = pt(16, curve[4])
    assert next_points(SMS, measured) == [24, 32]                   # step 2 of [16, 32]


def test_extra_points_are_ignored_and_change_nothing():
    curve = [30, 20, 14, 11, 10, 10.6, 12]
    everything = {v: pt(v, curve[i]) for i, v in enumerate(SMS)}
    assert next_points(SMS, everything) == []
    best, path = result(SMS, everything)
    assert (best, path) == run(SMS, curve)[:2]


def test_path_records_steps():
    _, path, order, _ = run(SMS, v_curve(7, 0))
    assert [p["compared"] for p in path] == [[8, 16], [2, 4], [1, 2]]
    assert [p["kept"] for p in path] == [[1, 8], [1, 2], [1, 1]]
    assert path[0]["interval"] == [1, 32]
    assert path[0]["comparison"]["a"]["case"] == "v8"
    assert order == [8, 16, 2, 4, 1]


def test_single_candidate_and_unfinished_search():
    assert next_points([4], {}) == [4]
    assert result([4], {4: pt(4, 1.0)}) == (4, [])
    with pytest.raises(ValueError, match="not finished"):
        result(SMS, {})
    with pytest.raises(ValueError):
        next_points([], {})
