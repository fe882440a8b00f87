"""schedule.simulate: sessions laid on a node's aligned GPU blocks, in dependency order, with worker-group
starts where no warm group of the TP is left on the block."""
import pytest

from tptune.schedule.simulate import Job, Node, blocks, simulate


def node(gpus, **kw):
    return Node(gpus=gpus, start_s={1: 0.0, 2: 5.0, 4: 5.0, 8: 5.0}, **kw)


def test_tp2_sessions_run_on_every_pair_at_once():
    jobs = [Job(f"s{i}", 2, 10.0) for i in range(4)]
    on8 = simulate(jobs, node(8))
    assert sorted(p.gpus for p in on8.placed.values()) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert on8.span_s == pytest.approx(15.0)          # one group start, then 10 s, on every pair
    on4 = simulate(jobs, node(4))
    assert on4.span_s == pytest.approx(25.0)          # two rounds of two pairs; the second finds its group warm
    assert on4.per_tp()[2]["group_starts"] == 2


def test_dependencies_and_gaps_order_the_sessions():
    jobs = [Job("a", 2, 10.0), Job("b", 2, 4.0, deps=("a",), gap_s=3.0), Job("c", 4, 2.0, deps=("a", "b"), gap_s=1.0)]
    s = simulate(jobs, node(8))
    a, b, c = (s.placed[n] for n in "abc")
    assert b.start == pytest.approx(a.end + 3.0)
    assert c.start == pytest.approx(b.end + 1.0) and c.group_start   # no TP 4 group yet
    assert s.busy_s == pytest.approx(s.span_s - 3.0 - 1.0)


def test_a_tp4_session_waits_for_a_quad_while_pairs_keep_busy():
    """No reservation: a TP 2 session that can start now takes a free pair before a TP 4 session that
    needs both pairs, as Snakemake's scheduler does with --resources gpus=4."""
    jobs = [Job("long", 2, 30.0), Job("short", 2, 5.0), Job("quad", 4, 1.0, deps=("short",), priority=-1),
            Job("later", 2, 5.0, deps=("short",))]
    s = simulate(jobs, node(4))
    assert s.placed["later"].start < s.placed["quad"].start
    assert s.placed["quad"].start >= s.placed["long"].end


def test_an_idle_group_times_out_and_is_started_again():
    jobs = [Job("a", 2, 1.0), Job("b", 2, 1.0, deps=("a",), gap_s=20.0), Job("c", 2, 1.0, deps=("b",), gap_s=40.0)]
    s = simulate(jobs, node(2, idle_timeout_s=30.0))
    assert [s.placed[n].group_start for n in "abc"] == [True, False, True]
    warm = simulate(jobs, node(2, idle_timeout_s=30.0, warm_at_start=(((0, 1), 2),)))
    assert not warm.placed["a"].group_start


def test_a_group_over_other_gpus_retires_idle_groups_unless_kept():
    jobs = [Job("pair", 2, 1.0), Job("quad", 4, 1.0, deps=("pair",)), Job("again", 2, 1.0, deps=("quad",))]
    assert not simulate(jobs, node(4, keep_idle_groups=True)).placed["again"].group_start
    assert simulate(jobs, node(4, keep_idle_groups=False)).placed["again"].group_start


def test_what_cannot_be_scheduled_is_refused():
    with pytest.raises(ValueError, match="cyclic"):
        simulate([Job("a", 2, 1.0, deps=("b",)), Job("b", 2, 1.0, deps=("a",))], node(4))
    with pytest.raises(ValueError, match="not among the jobs"):
        simulate([Job("a", 2, 1.0, deps=("x",))], node(4))
    with pytest.raises(ValueError, match="does not fit"):
        blocks(4, 8)
