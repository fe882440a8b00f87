"""Per-case analysis and the run table: a bad trace marks its case failed; the others are untouched."""
import json
import shutil

import polars as pl

from tptune.cli.stages import analyze_case, analyze_session, collect
from tptune.records.run_dir import RunDir

from conftest import FIXTURES

TP4 = FIXTURES / "gpu" / "tp4"


def _case(run_dir, op, variant, traces):
    d = run_dir / "sessions" / op / "tp4" / "point" / variant
    d.mkdir(parents=True)
    run = json.loads((TP4 / f"{op}-tp4-{variant}.run.json").read_text())
    names = []
    for i, src in enumerate(traces):
        name = f"trace.rank{i}.json.gz"
        if isinstance(src, bytes):
            (d / name).write_bytes(src)
        else:
            shutil.copy(src, d / name)
        names.append(name)
    run["traces"] = names
    (d / "run.json").write_text(json.dumps(run))
    return d / "run.json"


def test_corrupt_trace_fails_only_its_case(tmp_path):
    good = TP4 / "qkv-tp4-none.rank0.trace.json.gz"
    truncated = good.read_bytes()[: len(good.read_bytes()) // 2]
    runs = [
        _case(tmp_path, "qkv", "none", [good]),
        _case(tmp_path, "qkv", "ub.te", [TP4 / "qkv-tp4-ub.te.rank0.trace.json.gz", truncated]),
    ]
    for r in runs:
        case = r.parent
        analyze_case(r, tmp_path / "per-case" / f"{case.name}.parquet")
    bad = pl.read_parquet(tmp_path / "per-case/ub.te.parquet")
    assert bad.height == 1 and "trace.rank1.json.gz" in bad["error"][0]
    sess = tmp_path / "sessions/qkv/tp4/point"
    (sess / "session.json").write_text(json.dumps({"session": "qkv/tp4/point", "runs": {
        json.loads(r.read_text())["case"]: f"{r.parent.name}/run.json" for r in runs}}))
    analysis = RunDir(tmp_path).session_analysis(sess)
    assert analysis == tmp_path / "analysis/qkv/tp4/point.parquet"
    both = analyze_session(sess, analysis)
    assert set(both["case"].to_list()) == {"qkv-tp4-none", "qkv-tp4-ub.te"}
    table = collect(RunDir(tmp_path), [sess / "session.json"], tmp_path / "measurements.parquet")
    rows = {r["case"]: r for r in table.iter_rows(named=True)}
    assert rows["qkv-tp4-ub.te"]["status"] == "failed" and rows["qkv-tp4-ub.te"]["error_kind"] == "trace"
    assert "trace analysis failed" in rows["qkv-tp4-ub.te"]["error"]
    ok = rows["qkv-tp4-none"]
    assert ok["status"] == "ok" and ok["fwd_comm_ms"] > 0 and ok["fwd_overlap_ms"] == 0.0
    # where its rounds went (a GPU run of an older harness, which recorded no hold and no teardown)
    assert 0 < ok["timed_s"] < ok["measure_s"] and ok["init_s"] > 0
    assert ok["hold_s"] is None and ok["close_s"] is None
    assert (tmp_path / "measurements.csv").exists()
