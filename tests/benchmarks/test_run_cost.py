"""benchmarks/run_cost.py: where a run's time went, from measurements.csv (synthetic rows, a committed
GPU run recorded before the cost columns, and a missing run)."""
import csv
import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import run_cost as rc  # noqa: E402

COLS = ["op", "status", "rounds", "wall_s", "case_s", "init_s", "measure_s", "close_s", "timed_s", "hold_s"]


def _write(run, rows):
    run.mkdir(parents=True, exist_ok=True)
    with (run / "measurements.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS)
        w.writeheader()
        w.writerows(rows)


def test_parts_add_up_to_what_each_member_held(tmp_path):
    run = tmp_path / "run"
    _write(run, [
        # 4 rounds: held 3.0 = case 2.6 + close 0.2 + handling 0.2; case = init 0.1 + measure 2.4 + evidence 0.1;
        # measure = window 2.0 + hold 0.3 + warm-up 0.1
        {"op": "qkv", "status": "ok", "rounds": 4, "wall_s": 3.0, "case_s": 2.6, "init_s": 0.1, "measure_s": 2.4,
         "close_s": 0.2, "timed_s": 2.0, "hold_s": 0.3},
        {"op": "qkv", "status": "ok", "rounds": 2, "wall_s": 1.2, "case_s": 1.0, "init_s": 0.1, "measure_s": 0.9,
         "close_s": 0.1, "timed_s": 0.8, "hold_s": 0.1},
        {"op": "fc1", "status": "failed", "rounds": "", "wall_s": 9.0},
    ])
    (run / "wall_s.txt").write_text("10\n")
    res = rc.run_cost(run)
    q = res["ops"]["qkv"]
    assert q["member_rounds"] == 6 and q["held_s"] == pytest.approx(4.2)
    assert q["window"] == pytest.approx(2.8) and q["hold"] == pytest.approx(0.4)
    assert q["warm-up etc."] == pytest.approx(0.1) and q["evidence"] == pytest.approx(0.1)
    assert q["handling"] == pytest.approx(0.2 + 0.1)
    assert res["ops"]["all"] == q and "fc1" not in res["ops"] and res["wall_s"] == 10.0


def test_a_run_recorded_before_the_cost_columns_prints_what_it_has():
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/run_cost.py"),
                        str(ROOT / "results/stability-llama3-70b-x2-v4/rep2")], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    res = rc.run_cost(ROOT / "results/stability-llama3-70b-x2-v4/rep2")
    assert res["ops"]["all"]["member_rounds"] == 196 and res["ops"]["all"]["window"] is None
    assert res["wall_s"] == 164.0 and "run wall time 164 s" in p.stdout


def test_a_folder_without_measurements_is_named(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/run_cost.py"), str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and f"{tmp_path}/measurements.csv: no measurements.csv" in p.stderr


def _session(run, rel, started, wall):
    d = run / "sessions" / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / "session.json").write_text(json.dumps({"started": started, "wall_s": wall}))


def test_the_timeline_counts_concurrent_sessions_once_and_names_the_idle_time(tmp_path):
    """Two TP 2 sessions at once on a 4-GPU node, a gap, a point, a block: busy is the union of the
    intervals, idle what the span leaves, and each kind sums its own sessions."""
    run = tmp_path / "run"
    _write(run, [{"op": "qkv", "status": "ok", "rounds": 2, "wall_s": 1.0}])
    (run / "wall_s.txt").write_text("40\n")
    _session(run, "qkv/tp2/knobs/step0", 100.0, 10.0)
    _session(run, "fc1/tp2/knobs/step0", 102.0, 4.0)       # inside qkv's step: counts once
    _session(run, "qkv/tp2/point", 112.0, 5.0)             # 2 s idle before it
    _session(run, "layer/tp2", 120.0, 8.0)                 # 3 s idle before it
    tl = rc.run_cost(run)["timeline"]
    assert tl["kinds"] == {"steps": {"sessions": 2, "s": 14.0}, "points": {"sessions": 1, "s": 5.0},
                           "blocks": {"sessions": 1, "s": 8.0}}
    assert tl["span_s"] == pytest.approx(28.0) and tl["busy_s"] == pytest.approx(23.0)
    assert tl["idle_s"] == pytest.approx(5.0)
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/run_cost.py"), str(run)], capture_output=True,
                       text=True, timeout=60)
    assert "span 28.0 s, of which no session ran 5.0 s" in p.stdout
    assert "outside the sessions' span (start-up, the jobs after the last session): 12.0 s" in p.stdout


def test_the_timeline_of_a_committed_2_gpu_run():
    """knobs-llama3-70b-x2-fast-rep2 (2x H200): one session at a time, so busy is the sessions' sum."""
    res = rc.run_cost(ROOT / "results/knobs-llama3-70b-x2-fast-rep2")
    tl = res["timeline"]
    assert {k: v["sessions"] for k, v in tl["kinds"].items()} == {"steps": 19, "points": 4, "blocks": 1}
    assert tl["busy_s"] == pytest.approx(sum(v["s"] for v in tl["kinds"].values()))
    assert 0 < tl["idle_s"] < tl["span_s"] <= res["wall_s"]
