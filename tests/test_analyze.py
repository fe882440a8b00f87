"""Per-case analysis and the run table: a bad trace marks its case failed; the others are untouched."""
import json
import shutil

import polars as pl

from tptune.analyze import analyze_case, collect

from conftest import FIXTURES

TP4 = FIXTURES / "gpu" / "tp4"


def _case(run_dir, op, variant, traces):
    d = run_dir / "cases" / op / "tp4" / variant
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
        analyze_case(r, tmp_path / "analysis" / "qkv" / "tp4" / f"{case.name}.parquet")
    bad = pl.read_parquet(tmp_path / "analysis/qkv/tp4/ub.te.parquet")
    assert bad.height == 1 and "trace.rank1.json.gz" in bad["error"][0]
    table = collect(tmp_path, runs, tmp_path / "measurements.parquet")
    rows = {r["case"]: r for r in table.iter_rows(named=True)}
    assert rows["qkv-tp4-ub.te"]["status"] == "failed" and rows["qkv-tp4-ub.te"]["error_kind"] == "trace"
    assert "trace analysis failed" in rows["qkv-tp4-ub.te"]["error"]
    ok = rows["qkv-tp4-none"]
    assert ok["status"] == "ok" and ok["fwd_comm_ms"] > 0 and ok["fwd_overlap_ms"] == 0.0
    assert (tmp_path / "measurements.csv").exists()
