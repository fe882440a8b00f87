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
