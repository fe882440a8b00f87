"""records.measured_point: a run.json point read typed and written back exactly, on the committed GPU runs."""
import json
from pathlib import Path

import pytest

from tptune.emit.configs import write_decisions_json
from tptune.emit.records import write_record
from tptune.errors import RecordError
from tptune.records import load
from tptune.records.measured_point import INF, MeasuredPoint, TimingSummary
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session, read_point
from tptune.stats.bound import burned_in

RESULTS = Path(__file__).resolve().parents[2] / "results"
KNOBS = RESULTS / "knobs-llama3-70b-x2"
FAILED = RESULTS / "numerics-calibration/h100x4-llama3-70b-tp2/sessions/layer/tp2/ub.pair2/run.json"


def test_every_run_json_of_a_committed_run_round_trips_exactly():
    files = sorted(KNOBS.glob("sessions/**/run.json")) + [FAILED]
    assert len(files) > 100
    for f in files:
        raw = json.loads(f.read_text())
        assert json.dumps(MeasuredPoint.from_dict(raw, str(f)).to_dict()) == json.dumps(raw), f


def test_point_json_and_decisions_json_write_back_byte_identical(tmp_path):
    """The TP points (point.json) and decisions.json carry slim points; read typed and written again by
    the writers the stages use, the committed files come back byte for byte."""
    run = RunDir(KNOBS)
    for op in ("qkv", "proj", "fc1", "fc2"):
        pt = load.tp_point(run, op, 2)
        assert isinstance(pt["none"], MeasuredPoint) and all(
            isinstance(p, MeasuredPoint) for p in pt["candidates"].values())
        write_record(tmp_path / f"{op}.json", pt)
        assert (tmp_path / f"{op}.json").read_bytes() == run.tp_point(op, 2).read_bytes()
    doc = json.loads(run.decisions_json.read_text())
    for rec in doc["ops"].values():   # typed as the deciding stage holds them
        rec["points"] = {tp: {k: MeasuredPoint.from_dict(v) if k in ("none", "nocomm", "best", "fastest") and v
                              else v for k, v in p.items()} for tp, p in rec["points"].items()}
    write_decisions_json(tmp_path / "decisions.json", doc["ops"].values(), doc["meta"])
    assert (tmp_path / "decisions.json").read_bytes() == run.decisions_json.read_bytes()


def test_typed_fields_read_what_run_json_records():
    f = next(KNOBS.glob("sessions/fc1/tp2/point/nocomm/run.json"))
    raw, p = json.loads(f.read_text()), read_point(f)
    tot = raw["timing"]["total_ms"]
    assert (p.case, p.status, p.session) == (raw["case"], "ok", "fc1/tp2/point")
    assert p.median() == tot["median"] and p.samples() == tot["samples"]
    assert p.rounds() == dict(zip(tot["round_ids"], tot["rounds"]))
    assert p.timing["fwd_ms"].p90 == raw["timing"]["fwd_ms"]["p90"]
    assert p.host_ms == raw["host"]["host_ms"] and p.host_batches == raw["host"]["batches"]
    assert p.gpu_memory_gib == raw["environment"]["gpu_memory_gib"]
    slim = p.slim()
    assert slim.samples() == [] and slim.host_batches == [] and slim.median() == p.median()
    assert slim.attempts == [] and "attempts" not in slim.to_dict()
    burned = burned_in(slim)   # the bound without its first round: rounds, ids and median change, nothing else
    assert sorted(burned.rounds()) == sorted(p.rounds())[1:] and burned.burn_in["dropped_rounds"] == [0]
    assert list(burned.to_dict()) == list(slim.to_dict()) + ["burn_in"]


def test_a_failed_point_is_infinitely_slow():
    p = read_point(FAILED)
    assert p.status == "failed" and p.median() == INF and p.rounds() == {} and not p.ok
    assert p.error_kind and p.error_message


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("case"), "'case'"),
    (lambda d: d.update(status=None), "'status'"),
    (lambda d: d.update(session=3), "'session'"),
    (lambda d: d.update(error="oom"), "'error'"),
    (lambda d: d.update(timing=[1.0]), "'timing'"),
    (lambda d: d["timing"]["total_ms"].update(median="fast"), "'timing.total_ms'.median"),
    (lambda d: d["timing"]["fwd_ms"]["samples"].append("x"), "'timing.fwd_ms'.samples"),
    # issue 54 item 4: times that no clock gives (NaN and inf tracebacked in rederive; a negative median was
    # worded "at the bound")
    (lambda d: d["timing"]["total_ms"].update(median=float("nan")), "'timing.total_ms'.median: nan"),
    (lambda d: d["timing"]["total_ms"]["rounds"].__setitem__(1, float("inf")), "'timing.total_ms'.rounds: inf"),
    (lambda d: d["timing"]["total_ms"].update(median=-5.0), "'timing.total_ms'.median: -5.0"),
    (lambda d: d["timing"]["bwd_ms"]["samples"].__setitem__(0, 0.0), "'timing.bwd_ms'.samples: 0.0"),
    (lambda d: d["timing"]["total_ms"].update(mean=float("-inf")), "'timing.total_ms'.mean: -inf"),
    (lambda d: d["timing"]["per_rank_median_total_ms"].__setitem__(0, float("nan")),
     "'timing.per_rank_median_total_ms': nan"),
])
def test_a_malformed_run_json_names_its_file_and_field(tmp_path, change, field):
    raw = json.loads(next(KNOBS.glob("sessions/fc1/tp2/point/none/run.json")).read_text())
    change(raw)
    f = tmp_path / "none" / "run.json"
    f.parent.mkdir()
    f.write_text(json.dumps(raw))
    with pytest.raises(RecordError) as e:
        read_point(f)
    assert str(f) in str(e.value) and field in str(e.value)


def test_a_malformed_member_is_unreadable_in_a_lenient_load_and_an_error_in_a_strict_one(tmp_path):
    d = tmp_path / "qkv" / "tp2" / "point"
    (d / "none").mkdir(parents=True)
    (d / "none" / "run.json").write_text(json.dumps({"case": "qkv-tp2-none", "status": "ok", "timing": "fast"}))
    (d / "session.json").write_text(json.dumps({"session": "qkv/tp2/point", "runs": {"qkv-tp2-none": "none/run.json"}}))
    assert load_session(d, strict=False).unreadable == ("qkv-tp2-none",)
    with pytest.raises(RecordError, match="none/run.json: field 'timing'"):
        load_session(d)
    with pytest.raises(RecordError, match="expected a measured point"):
        MeasuredPoint.from_dict([1, 2], "x.json")


def test_a_built_point_writes_the_fields_it_has():
    p = MeasuredPoint("qkv-tp2-none", "ok", "s", timing={"total_ms": TimingSummary(median=2.0, rounds=(2.0, 2.1))})
    assert p.to_dict() == {"case": "qkv-tp2-none", "status": "ok", "session": "s",
                           "timing": {"total_ms": {"median": 2.0, "rounds": [2.0, 2.1]}}}
    assert p.with_(session=None).to_dict()["session"] is None
    assert list(MeasuredPoint("x", "failed").to_dict()) == ["case", "status"]


# -- issue 54 item 4: records checked where they are loaded: the file and the field, never a traceback --------

def _session(tmp_path, edit=None):
    """A copy of a committed TP point session (TP 2), ``edit(folder)`` applied."""
    src = KNOBS / "sessions" / "fc1" / "tp2" / "point"
    d = tmp_path / "fc1" / "tp2" / "point"
    d.mkdir(parents=True)
    rec = json.loads((src / "session.json").read_text())
    (d / "session.json").write_text(json.dumps(rec))
    for p in rec["runs"].values():
        (d / p).parent.mkdir(parents=True, exist_ok=True)
        (d / p).write_text((src / p).read_text())
    if edit:
        edit(d)
    return d


def _edit_member(d, change, member="none/run.json"):
    raw = json.loads((d / member).read_text())
    change(raw)
    (d / member).write_text(json.dumps(raw))


@pytest.mark.parametrize("edit, says", [
    (lambda d: (d / "session.json").write_text((d / "session.json").read_text()[:100]),
     "session.json: not JSON (Expecting"),
    (lambda d: (d / "none" / "run.json").write_text("not json {"), "none/run.json: not JSON (Expecting value"),
    (lambda d: ((d / "none" / "run.json").unlink(), (d / "none" / "run.json").symlink_to(d.parent / "elsewhere.txt"),
                (d.parent / "elsewhere.txt").write_bytes(b"\xff\xfe binary")),
     "none/run.json (a link to "),
    (lambda d: (d / "none" / "run.json").write_text("[" * 100000 + "]" * 100000),
     "none/run.json: nested deeper than"),
    (lambda d: (d / "none" / "run.json").write_text(
        '{"case": "fc1-tp2-none", "status": "ok", "x": ' + "[" * 100 + "]" * 100 + "}"),
     "none/run.json: nested deeper than"),
    (lambda d: _edit_member(d, lambda r: r.update(tp=4)), "none/run.json: field 'tp': 4, but the session measures TP 2"),
    (lambda d: _edit_member(d, lambda r: r.update(case="fc1-tp4-none", tp=4)),
     "none/run.json: field 'case': 'fc1-tp4-none', but session.json lists this member as 'fc1-tp2-none'"),
    (lambda d: _edit_member(d, lambda r: r.update(session="fc1/tp4/point")),
     "none/run.json: field 'session': 'fc1/tp4/point', but the session is 'fc1/tp2/point'"),
    (lambda d: (d / "session.json").write_text(json.dumps(
        {**json.loads((d / "session.json").read_text()), "runs": {"fc1-tp2-none": "/etc/passwd"}})),
     "session.json: field 'runs.fc1-tp2-none': '/etc/passwd': expected a member's run.json inside the session folder"),
    (lambda d: (d / "session.json").write_text("[]"), "session.json: expected a session record (a mapping"),
])
def test_a_session_read_at_the_edge_is_refused_naming_its_file_and_field(tmp_path, edit, says):
    """Was: JSONDecodeError, UnicodeDecodeError or RecursionError tracebacks; a member claiming TP 4 in a TP 2
    session was merged into its tables."""
    d = _session(tmp_path, edit)
    with pytest.raises(RecordError) as e:
        load_session(d)
    assert says in str(e.value) and str(d) in str(e.value), str(e.value)
    assert "\n" not in str(e.value)


def test_the_unedited_session_copy_reads(tmp_path):
    """The copy the cases above edit reads as it is (so each case fails on its edit alone)."""
    assert "fc1-tp2-none" in load_session(_session(tmp_path)).points


def test_a_sessions_trace_table_reads_its_members_through_the_same_checks(tmp_path):
    """trace.session_tables.session_table (tptune analyze-session) read session.json and run.json unchecked."""
    from tptune.trace.session_tables import session_table
    d = _session(tmp_path, lambda d: _edit_member(d, lambda r: r.update(tp=4)))
    with pytest.raises(RecordError, match="none/run.json: field 'tp': 4, but the session measures TP 2"):
        session_table(d)
