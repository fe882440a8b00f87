"""benchmarks/replay_stopping.py on recorded GPU sessions and benchmarks/window_length.py: its arithmetic on
synthetic rounds and a real CPU session through the tuning harness."""
import json
import math
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config

sys.path.insert(0, str(ROOT / "benchmarks"))
import window_length as wl  # noqa: E402


def test_replay_of_recorded_sessions_saves_member_rounds(tmp_path):
    out = tmp_path / "replay.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/replay_stopping.py"),
                        str(ROOT / "results/stability-llama3-70b-x2-v2/rep1/sessions"), "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert len(rows) == 17
    off = sum(r["off"]["member_rounds"] for r in rows)
    on = sum(r["on"]["member_rounds"] for r in rows)
    assert on < off
    # the v2 run had no futility stop: a replay without it reproduces each session's recorded rounds
    recorded = {r["session"]: json.loads((ROOT / r["session"] / "session.json").read_text())["rounds"]
                for r in rows}
    assert sum(r["off"]["rounds"] == recorded[r["session"]] for r in rows) >= 12
    step = next(r for r in rows if r["session"].endswith("fc1/tp2/dgrad.bulk/step0"))
    assert (step["off"]["rounds"], step["on"]["rounds"]) == (6, 3)
    assert step["on"]["stop"].startswith("futile after 3 rounds")
    assert f"member-rounds {off} without, {on} with the futility stop" in p.stdout
    assert "comparisons with the leader" in p.stdout and "side -> undecided" in p.stdout


def test_window_value_takes_the_iterations_a_shorter_window_would_have_timed():
    its = [1.0, 1.0, 1.0, 5.0, 5.0, 5.0]
    assert wl.window_value(its, 3.0, 2) == 1.0          # the first three fit
    assert wl.window_value(its, 8.0, 2) == 1.0          # 1+1+1+5 = 8: four, median 1.0
    assert wl.window_value(its, 100.0, 2) == 3.0        # all six
    assert wl.window_value(its, 0.5, 2) == 1.0          # at least min_iters
    assert wl.window_value(its, 0.5, 6) == 3.0
    assert wl.split_rounds([1, 2, 3, 4, 5], [2, 3]) == [[1, 2], [3, 4, 5]]
    with pytest.raises(ValueError):
        wl.split_rounds([1, 2, 3], [2, 2])


def test_a_skip_drops_the_first_ms_of_each_window_as_a_longer_preroll_would():
    its = [2.0, 2.0, 1.0, 1.0, 1.0, 1.0]
    assert wl.window_value(its, 2.0, 1) == 2.0
    assert wl.window_value(its, 2.0, 1, skip_ms=4.0) == 1.0      # the two slow iterations fall in the skip
    assert wl.window_value(its, 2.0, 1, skip_ms=3.0) == 1.0      # a skip ends on an iteration's end
    assert wl.window_value(its, 1.0, 1, skip_ms=100.0) == 1.0    # the last iteration stays


def test_analyse_gives_each_members_level_against_the_longest_skip():
    # a starts 20% slow (an unsettled clock) for 1 ms of each window; b is flat
    a = {"rounds": [[1.2, 1.0, 1.0, 1.0], [1.2, 1.0, 1.0, 1.0]], "min_iters": 1, "overhead_s": 0.1}
    b = {"rounds": [[1.0] * 4] * 2, "min_iters": 1, "overhead_s": 0.1}
    short, settled = wl.analyse({"a": a, "b": b}, [1.0], 0.01, skips=(0.0, 1.0))
    assert (short["skip_ms"], settled["skip_ms"]) == (0.0, 1.0)
    assert short["ratio"] == pytest.approx(1.2) and settled["ratio"] == pytest.approx(1.0)
    assert short["level"] == pytest.approx([1.2, 1.0]) and settled["level"] == pytest.approx([1.0, 1.0])
    assert settled["round_pair_s"] == pytest.approx(2 * (0.002 + 0.1))   # a skip's GPU time is paid


def _noise_call(call, batches):
    return {"call": call, "batches": [{"iters": len(b)} for b in batches], "iterations_ms": [t for b in batches for t in b]}


def test_replay_noise_pairs_a_setting_with_its_reference_by_call():
    # the setting runs 10% slow for its first 2 ms of each batch; the reference is flat; call 1 is 4% slower
    # in both (a level the pairing removes)
    slow = [1.1, 1.1, 1.0, 1.0, 1.0, 1.0]
    rec = {"calls": {"fc2/gpu": [_noise_call(0, [slow, slow]), _noise_call(1, [[x * 1.04 for x in slow]] * 2)],
                     "fc2/gpu:none": [_noise_call(0, [[1.0] * 6] * 2), _noise_call(1, [[1.04] * 6] * 2)],
                     "fc2/events": [_noise_call(0, [[9.0]])]}}
    assert list(wl.noise_pairs(rec)) == ["fc2"]
    res = wl.replay_noise([rec], [2.0, 4.0], (0.0, 2.0), settled=(2.0, 4.0), min_iters=1)
    assert res["pairs"] == 1 and res["recorded_ms"] == pytest.approx(6.22)
    rows = {(r["skip_ms"], r["window_ms"]): r for r in res["table"]}
    assert set(rows) == {(0.0, 2.0), (0.0, 4.0), (2.0, 2.0), (2.0, 4.0)}
    assert rows[0.0, 2.0]["bias"]["fc2"][0] == pytest.approx(1.1)      # the unsettled start, against the rest
    assert rows[2.0, 4.0]["bias"]["fc2"][:3] == pytest.approx([1.0, 1.0, 1.0])
    assert all(r["sd"] == pytest.approx(0.0, abs=1e-12) and r["df"] == 1 for r in rows.values())
    assert wl.replay_noise([rec], [5.0], (0.0, 2.0), settled=(0.0, 2.0), min_iters=1)["table"][0]["skip_ms"] == 0.0
    with pytest.raises(ValueError, match="settled skip plus window"):
        wl.replay_noise([rec], [2.0], (0.0,), settled=(4.0, 4.0), min_iters=1)
    with pytest.raises(ValueError, match="do not add up"):
        wl.call_batches({"call": 3, "batches": [{"iters": 2}], "iterations_ms": [1.0]})


def test_sd_interval_brackets_the_sd():
    lo, hi = wl.sd_interval(0.01, 120)
    assert 0.0088 < lo < 0.0090 and 0.0113 < hi < 0.0116      # chi-square(120): 91.6 and 152.2
    lo, hi = wl.sd_interval(0.01, 11)
    assert 0.0070 < lo < 0.0071 and 0.0168 < hi < 0.0172      # chi-square(11): 3.82 and 21.9
    lo, hi = wl.sd_interval(0.01, 1)
    assert 0.0044 < lo < 0.0045 and 0.31 < hi < 0.32          # chi-square(1): 0.000982 and 5.02


def test_window_length_replays_a_committed_x2_noise_recording(tmp_path):
    out = tmp_path / "r.json"
    rec = ROOT / "results/noise-x2/noise-lease4-window500-rounds3.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/window_length.py"), "--from-noise", str(rec),
                        "--windows", "100,300,500", "--skips", "0,200", "--json", str(out)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["pairs"] == 4 and 480 < res["recorded_ms"] < 560
    assert [(r["skip_ms"], r["window_ms"]) for r in res["table"]] == [(0, 100), (0, 300), (0, 500), (200, 100),
                                                                      (200, 300)]
    assert all(r["df"] == 24 and r["sd_lo"] < r["sd"] < r["sd_hi"] for r in res["table"])
    assert "paired by call" in p.stdout and "proj" in p.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "benchmarks/window_length.py"), "--from-noise",
                          str(tmp_path / "missing.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "missing.json" in bad.stderr


def test_rounds_needed_follows_the_t_interval():
    assert wl.rounds_needed(0.0, 0.01) == 2
    sd = 0.01
    n = wl.rounds_needed(sd, 0.01)
    t = wl.t975(n - 1) * sd / math.sqrt(n)
    assert t <= math.log1p(0.01) < wl.t975(n - 2) * sd / math.sqrt(n - 1)
    assert wl.rounds_needed(1.0, 0.01, most=50) == 50


def test_analyse_prices_each_window():
    # member a's rounds step up after 2 ms of each window; b stays flat: a short window misses the step
    a = {"rounds": [[1.0, 1.0, 1.3, 1.3, 1.3], [1.0, 1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.3, 1.3, 1.3]],
         "min_iters": 1, "overhead_s": 0.1}
    b = {"rounds": [[1.0] * 5] * 3, "min_iters": 1, "overhead_s": 0.1}
    short, full = wl.analyse({"a": a, "b": b}, [2.0, 5.0], 0.01)
    assert short["sd"] == 0.0 and short["ratio"] == pytest.approx(1.0) and short["rounds"] == 2
    assert full["sd"] > 0.05 and full["rounds"] > 2
    assert short["round_pair_s"] == pytest.approx(2 * (0.002 + 0.1))
    assert full["s_per_decision"] == pytest.approx(full["rounds"] * full["round_pair_s"])


@pytest.mark.slow
def test_window_length_runs_a_real_session_on_cpu(tmp_path, pool_dir):
    cfg = base_config(pool_dir, ops=["fc2"], tp_sizes=[2])
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    out = tmp_path / "w.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks/window_length.py"), "--config", str(tmp_path / "c.yaml"),
                        "--tp", "2", "--shard", "2", "--rounds", "3", "--window-ms", "50", "--windows", "5,40",
                        "--preroll-ms", "0", "--skips", "0,10",
                        "--json", str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["shard"] == 2 and res["model"].endswith("/shard2")
    members = res["ops"]["fc2"]["members"]
    assert sorted(members) == ["fc2-tp2-nocomm", "fc2-tp2-none"]
    assert all(len(m["rounds"]) == 3 and m["overhead_s"] > 0 for m in members.values())
    table = res["ops"]["fc2"]["table"]
    assert [(r["skip_ms"], r["window_ms"]) for r in table] == [(0.0, 5.0), (0.0, 40.0), (10.0, 5.0), (10.0, 40.0)]
    assert res["preroll_ms"] == 0.0 and all(len(r["level"]) == 2 for r in table)
    assert "fc2" in p.stdout and "rounds for a 95% half-width of 1%" in p.stdout
    assert "each member's level against a skip of 10 ms" in p.stdout
