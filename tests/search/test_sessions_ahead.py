"""search.ahead: the sessions a run still plans, read from committed GPU runs cut back to an earlier state
(their records and sessions removed as a run in flight has not written them yet)."""
import json
import shutil

from tptune.measure.preflight import resolve_here
from tptune.records.run_dir import RunDir
from tptune.search.ahead import sessions_ahead, tps_reached

from conftest import ROOT

TP24 = ROOT / "results" / "tp24-llama3-70b-h200x4" / "rep1"      # knob search, TP 2 + 4, four ops
BISECT = ROOT / "results" / "stability-llama3-70b-x2" / "rep1"   # bisection, TP 2


def _copy(src, tmp_path):
    run = RunDir(tmp_path / src.name)
    shutil.copytree(src, run.root, ignore=shutil.ignore_patterns("*.parquet", "*.png", "trace*", "analysis"))
    cfg = json.loads(run.config_json.read_text())
    cfg.pop("_source", None), cfg.pop("_base_dir", None)
    return resolve_here(cfg, base_dir=ROOT, check_hardware=False), run


def _unmeasure(session_dir):
    (session_dir / "session.json").unlink()


def test_a_finished_run_plans_nothing(tmp_path):
    s, run = _copy(TP24, tmp_path)
    assert sessions_ahead(s, run).sessions == frozenset() and sessions_ahead(s, run).final
    assert all(tps_reached(s, run, op) == [2, 4] for op in s.ops)


def test_a_knob_run_at_tp2_plans_its_next_sessions(tmp_path):
    s, run = _copy(TP24, tmp_path)
    run.searches_done.unlink()
    for op in s.ops:                                   # back to before any TP 2 decision
        shutil.rmtree(run.tp_search(op, 4))
        shutil.rmtree(run.sessions / op / "tp4")
        run.tp_decision(op, 2).unlink()
    for tp in (2, 4):
        shutil.rmtree(run.layer_session(tp))
    ahead = sessions_ahead(s, run)
    assert (ahead.sessions, ahead.final) == ({"layer/tp2"}, False)   # every TP 2 search and point done
    _unmeasure(run.point_session("qkv", 2))
    steps = sorted(run.tp_search("qkv", 2).joinpath("knobs").glob("step*.json"))
    last = len(steps) - 1
    steps[-1].unlink()           # the last knob step measured, its checkpoint not run: nothing new is known
    assert sessions_ahead(s, run).sessions == {"layer/tp2", "qkv/tp2/point"}
    _unmeasure(run.step_session("qkv", 2, "knobs", last))    # ... and now its session is in flight
    assert sessions_ahead(s, run).sessions == {"layer/tp2", "qkv/tp2/point", f"qkv/tp2/knobs/step{last}"}
    # qkv's TP decision reached TP 4: its knob search's first session and its point join; the TP 4 block
    # waits until every op has reached TP 4
    run.tp_decision("qkv", 2).write_text(json.dumps({"op": "qkv", "tp": 2, "next": 4}))
    assert tps_reached(s, run, "qkv") == [2, 4]
    assert sessions_ahead(s, run).sessions == {"layer/tp2", "qkv/tp2/point", f"qkv/tp2/knobs/step{last}",
                                               "qkv/tp4/knobs/step0", "qkv/tp4/point"}


def test_a_bisection_plans_every_halving_left(tmp_path):
    s, run = _copy(BISECT, tmp_path)
    run.searches_done.unlink()
    shutil.rmtree(run.layer_session(2))
    assert sessions_ahead(s, run).sessions == {"layer/tp2"}
    dim = run.tp_search("qkv", 2) / "dgrad.bulk"
    assert json.loads((dim / "step0.json").read_text())["candidates"] == [1, 2, 4, 8, 16, 24, 32]
    for k in (1, 2):             # 7 candidates: 3 halvings, one done
        (dim / f"step{k}.json").unlink()
        _unmeasure(run.step_session("qkv", 2, "dgrad.bulk", k))
    halvings = {"layer/tp2", "qkv/tp2/dgrad.bulk/step1", "qkv/tp2/dgrad.bulk/step2"}
    assert sessions_ahead(s, run).sessions == halvings
    # a dimension of one setting (fprop ring_exchange) measures nothing, whether or not its step is recorded
    (run.tp_search("qkv", 2) / "fprop.ring_exchange" / "step0.json").unlink()
    assert sessions_ahead(s, run).sessions == halvings
