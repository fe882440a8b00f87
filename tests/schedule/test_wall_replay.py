"""schedule.replay on the committed GPU runs: each run's own sessions replayed on its own node predict its
wall_s.txt within 10%, and the 8-GPU prediction (TP 8 extrapolated from TP 2 -> 4) keeps the workflow's
order and the node's GPUs."""
import json
from pathlib import Path

import pytest

from conftest import ROOT
from tptune.records.run_dir import RunDir
from tptune.schedule import measured as ms
from tptune.schedule.replay import predict

RESULTS = ROOT / "results"
WALLS = sorted(p.parent for p in RESULTS.glob("**/wall_s.txt"))
TP24 = RESULTS / "tp24-llama3-70b-h200x4" / "rep1"


def _replayable(run_dir: Path) -> list[ms.MeasuredSession]:
    """The run's sessions, or a skip saying why the run cannot be checked against its wall_s.txt."""
    jsons = sorted((run_dir / "sessions").glob("**/session.json"))
    if not jsons:
        pytest.skip("no sessions committed (only the run's small files)")
    if any(json.loads(p.read_text()).get("started") is None for p in jsons):
        pytest.skip("sessions recorded before session.json kept 'started': no timeline")
    sessions = ms.read_sessions(RunDir(run_dir))
    wall = float((run_dir / "wall_s.txt").read_text())
    if ms.span(sessions) > wall:
        pytest.skip(f"its sessions span {ms.span(sessions):.0f} s, more than wall_s.txt's {wall:.0f} s: part of them "
                    "was measured by another invocation (e.g. a layer stage finished on a later lease), which "
                    "wall_s.txt does not time")
    return sessions


def test_the_committed_runs_are_all_considered():
    assert len(WALLS) >= 20 and TP24 in WALLS


@pytest.mark.parametrize("run_dir", WALLS, ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_a_run_replayed_on_its_own_node_predicts_its_wall_time(run_dir):
    sessions = _replayable(run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())
    p = predict(RunDir(run_dir))
    assert p.gpus == cfg["gpus_per_node"] and p.tp_sizes == sorted({x.tp for x in sessions})
    assert p.sessions == len(sessions) and not p.extrapolated
    wall = float((run_dir / "wall_s.txt").read_text())
    assert abs(p.predicted_wall_s - wall) <= 0.10 * wall, "\n".join(p.lines())


def test_eight_gpus_extrapolate_tp8_from_the_tp2_to_tp4_scaling():
    sessions = _replayable(TP24)
    p = predict(RunDir(TP24), gpus=8)
    assert p.tp_sizes == [2, 4, 8]
    placed = p.schedule.placed
    tp4 = [x for x in sessions if x.tp == 4]
    tp8 = {n: q for n, q in placed.items() if q.tp == 8}
    assert sorted(tp8) == sorted(x.name.replace("tp4", "tp8", 1) for x in tp4)
    assert p.per_tp[8]["sessions"] == len(tp4) and any("TP 8" in e for e in p.extrapolated)

    # qkv's TP 8 steps: TP 4's seconds x (TP 4 / TP 2 seconds per member-round), from the session files
    def per_mr(tp):
        steps = [x for x in sessions if x.op == "qkv" and x.kind == "steps" and x.tp == tp]
        assert not any(x.group_starts for x in steps[1:])
        held = sum(x.held_s - (x.start_s or 0.0) for x in steps)
        return held / sum(x.members * x.rounds for x in steps)
    step = next(x for x in tp4 if x.name == "qkv/tp4/knobs/step3")
    assert not step.group_starts
    q = placed["qkv/tp8/knobs/step3"]
    assert q.end - q.start == pytest.approx(step.held_s * per_mr(4) / per_mr(2), rel=1e-6)

    # the node: never more than 8 GPUs busy, TP 2 on up to four pairs at once, a TP 8 session alone
    events = sorted({q.start for q in placed.values()})
    for t in events:
        running = [q for q in placed.values() if q.start <= t < q.end]
        assert sum(q.tp for q in running) <= 8
        assert len({g for q in running for g in q.gpus}) == sum(q.tp for q in running)
    assert max(sum(1 for q in placed.values() if q.tp == 2 and q.start <= t < q.end) for t in events) == 4
    # the workflow's order: steps in turn, the point after its steps, the next TP after the point, blocks last
    for op in ("qkv", "fc1"):
        for tp in (2, 4, 8):
            steps = sorted((q for n, q in placed.items() if n.startswith(f"{op}/tp{tp}/")
                            and "/step" in n), key=lambda q: int(q.name.rsplit("step", 1)[1]))
            point = placed[f"{op}/tp{tp}/point"]
            assert all(a.end <= b.start for a, b in zip(steps, steps[1:]))
            assert steps[-1].end <= point.start
            if tp > 2:
                assert placed[f"{op}/tp{tp // 2}/point"].end <= steps[0].start
    last_point = max(q.end for n, q in placed.items() if n.endswith("/point"))
    assert all(q.start >= last_point for n, q in placed.items() if n.startswith("layer/"))
    assert p.predicted_wall_s <= 600          # issue 45's goal for 8 GPUs with TP 2, 4 and 8


def test_tps_that_cannot_be_had_are_refused_with_the_reason():
    from tptune.errors import TptuneError

    one_tp = RESULTS / "qwen2.5-32b-h200x4-tp4"
    with pytest.raises(TptuneError, match="TP 2 was not measured"):
        predict(RunDir(one_tp), gpus=8, tp_sizes=[2, 4, 8])
    with pytest.raises(TptuneError, match="scaling from one TP to the next needs two measured TPs"):
        predict(RunDir(one_tp), gpus=8, tp_sizes=[4, 8])
    with pytest.raises(TptuneError, match="does not fit 4 GPUs"):
        predict(RunDir(TP24), tp_sizes=[2, 4, 8])
    assert predict(RunDir(one_tp), gpus=8).tp_sizes == [4]     # two quads at once, nothing extrapolated


@pytest.mark.parametrize("run_dir", [p for p in WALLS if json.loads((p / "config.json").read_text())
                                     .get("gpus_per_node") == 4], ids=lambda p: p.relative_to(RESULTS).as_posix())
def test_the_committed_8gpu_predictions_are_this_codes(run_dir):
    """Each committed 4-GPU run's wall_s.8gpu-predicted.txt is what tptune predict --gpus 8 says now."""
    committed = run_dir / "wall_s.8gpu-predicted.txt"
    assert committed.is_file(), f"{committed}: run tptune predict {run_dir.relative_to(ROOT)} --gpus 8"
    assert int(committed.read_text()) == round(predict(RunDir(run_dir), gpus=8).predicted_wall_s)
