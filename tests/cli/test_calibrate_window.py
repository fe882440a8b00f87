"""window_calibration (tptune calibrate-window): the window table and choice on synthetic recordings with
clock spells, a real calibration session on CPU through the tuning harness, and the CLI's refusals."""
import json
import math
import random
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config
from tptune.stats.session_noise import resolvable_sd
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import deep_merge, load_config_files
from tptune.cli import calibrate as wc
from tptune.emit.calibration import write_calibration


def _spelled_round(rng, n=1500, spell=300, slow=1.2) -> list[float]:
    """n iterations of 1 ms with one slow spell of ``spell`` iterations at a random place: a card whose
    clock drops for a while, as the H100 of results/noise-h100 did."""
    its = [1.0 + rng.gauss(0.0, 0.002) for _ in range(n)]
    at = rng.randrange(0, n - spell)
    for i in range(at, at + spell):
        its[i] *= slow
    return its


def _records(rng, ops=("qkv", "fc1"), rounds=10):
    rec = {}
    for op in ops:
        rec[op] = {f"{op}-tp1-none": {"rounds": [_spelled_round(rng) for _ in range(rounds)], "min_iters": 5},
                   f"{op}-tp1-nocomm": {"rounds": [_spelled_round(rng) for _ in range(rounds)], "min_iters": 5}}
    return rec


def test_a_window_several_times_the_spells_rides_them_out():
    rows = wc.window_table(_records(random.Random(1)), [400.0, 1500.0])
    short, long_ = rows
    assert [r["window_ms"] for r in rows] == [400.0, 1500.0]
    assert short["df"] == long_["df"] == 18 and set(short["per_op"]) == {"qkv", "fc1"}
    assert short["sd"] > 4 * long_["sd"]          # a 300-iteration spell flips a 400-iteration median
    assert short["sd_lo"] < short["sd"] < short["sd_hi"]
    window, why = wc.choose_window(rows, (short["sd"] + long_["sd"]) / 2)
    assert window == 1500.0 and why.startswith("the shortest window")
    assert wc.choose_window(rows, short["sd"] * 1.01)[0] == 400.0
    window, why = wc.choose_window(rows, long_["sd"] / 2, overhead_s=0.2)
    assert window == 1500.0 and why.startswith("no candidate reached the target")
    assert wc.choose_window([], 0.01) == (None, "no candidate window was measured")


def test_without_a_window_that_reaches_the_target_the_cheapest_close_decision_wins():
    rows = [{"window_ms": 500.0, "sd": 0.025}, {"window_ms": 1000.0, "sd": 0.014}, {"window_ms": 2000.0, "sd": 0.013}]
    # sd^2 x (window + overhead): 500: 0.00044, 1000: 0.00027, 2000: 0.00037
    assert wc.choose_window(rows, 0.01, overhead_s=0.2)[0] == 1000.0
    # with a huge overhead per round the window's own cost no longer matters: the least sd
    assert wc.choose_window(rows, 0.01, overhead_s=100.0)[0] == 2000.0


def test_the_burn_in_round_is_left_out():
    rng = random.Random(2)
    flat = lambda: [1.0 + rng.gauss(0.0, 0.001) for _ in range(600)]   # noqa: E731
    a = {"rounds": [[x * 0.95 for x in flat()]] + [flat() for _ in range(5)], "min_iters": 5}  # round 0 fast
    b = {"rounds": [flat() for _ in range(6)], "min_iters": 5}
    rec = {"op": {"op-tp1-none": a, "op-tp1-nocomm": b}}
    with_first = wc.window_table(rec, [500.0])[0]
    without = wc.window_table(rec, [500.0], burn_in=1)[0]
    assert with_first["df"] == 5 and without["df"] == 4
    assert with_first["sd"] > 0.015 and without["sd"] < 0.002
    assert wc.reach_ms(rec)["op"] == pytest.approx(600.0, rel=0.01)


def test_the_target_is_a_share_of_what_the_round_budget_resolves():
    assert wc.target_sd(0.02, 6) == pytest.approx(wc.TARGET_FRACTION * resolvable_sd(0.02, 6))
    assert wc.target_sd(0.02, 10) > wc.target_sd(0.02, 6)


@pytest.mark.slow
def test_calibration_runs_real_sessions_and_writes_an_overlay_the_workflow_accepts(tmp_path, pool_dir):
    from tptune.measure.launch import Launcher

    cfg = base_config(pool_dir, ops=["fc2"], tp_sizes=[2])
    cfg["timing"].update(iters=12, warmup=1)
    s = resolve_here(cfg, source="test")
    rec = wc.calibrate(s, Launcher(s), candidates=[5.0, 40.0], rounds=3, work_dir=tmp_path)
    assert rec["shard"] == 2 and rec["model"].endswith("/shard2") and rec["tp"] == 1 and rec["failed"] == {}
    assert [r["window_ms"] for r in rec["table"]] == [5.0, 40.0]
    assert all(r["df"] == 2 and set(r["per_op"]) == {"fc2"} for r in rec["table"])
    members = rec["members"]["fc2"]
    assert sorted(members) == ["fc2-tp1-nocomm", "fc2-tp1-none"]
    # the burn-in round is measured and kept in the record, left out of the table
    assert rec["burn_in"] == 1
    assert all(len(m["rounds"]) == 4 and len(m["rounds"][0]) == 12 for m in members.values())
    assert rec["window_ms"] in (5.0, 40.0) and rec["target_sd"] == pytest.approx(
        wc.target_sd(s.decision.noise_floor, s.timing.max_rounds))
    js, overlay = write_calibration(rec, tmp_path / "calibration")
    assert js.exists() and overlay.read_text().startswith("# tptune calibrate-window on cpu:")
    run_cfg = tmp_path / "run.yaml"
    run_cfg.write_text(yaml.safe_dump(cfg))
    merged = resolve_here(deep_merge(load_config_files(run_cfg), load_config_files(overlay)), source="overlay")
    assert merged.timing.window_ms == rec["window_ms"]
    assert merged.timing.iters == 12          # the overlay changes the window alone
    text = wc.format_table(rec)
    assert "null pair none vs nocomm" in text and f"chosen: {rec['window_ms']:.0f} ms" in text
    # window.json re-derives to the same table and choice
    again = wc.analyse(json.loads(js.read_text()))
    assert again["table"] == rec["table"] and again["window_ms"] == rec["window_ms"]


def test_cli_refuses_cpu_and_bad_options(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, "-m", "tptune", "calibrate-window", *args], capture_output=True,
                              text=True, timeout=120, cwd=ROOT)
    p = run()
    assert p.returncode == 2 and "on CPU a round times timing.iters by wall clock" in p.stderr
    p = run(str(tmp_path / "missing.yaml"))
    assert p.returncode == 2 and "missing.yaml" in p.stderr and "file not found" in p.stderr


def test_the_committed_calibrations_re_derive(tmp_path):
    """Two H100 cards (results/window-calibration-h100): 500 ms left the null pairs at 2.0-2.7%, above the
    target; the calibration chose 1000, 750 and 750 ms. One H200 (results/window-calibration-h200): 500 ms."""
    for call, window in (("window-calibration-h100/call1", 1000.0), ("window-calibration-h100/call2", 750.0),
                         ("window-calibration-h100/call3-other-card", 750.0), ("window-calibration-h200", 500.0)):
        src = ROOT / "results" / call / "window.json"
        p = subprocess.run([sys.executable, "-m", "tptune", "calibrate-window", "--from", str(src), "--out",
                            str(tmp_path / call)], capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert p.returncode == 0, p.stderr[-2000:]
        assert f"chosen: {window:.0f} ms" in p.stdout
        assert yaml.safe_load((tmp_path / call / "window.yaml").read_text()) == {"timing": {"window_ms": window}}
        rec = json.loads(src.read_text())
        five = next(r for r in rec["table"] if r["window_ms"] == 500.0)
        if rec["gpu"] == "NVIDIA H100 80GB HBM3":      # 500 ms left more than the budget resolves
            assert five["sd"] > rec["target_sd"]
        else:                                           # the H200 keeps the default
            assert rec["gpu"] == "NVIDIA H200" and five["sd"] <= rec["target_sd"]
    p = subprocess.run([sys.executable, "-m", "tptune", "calibrate-window", "--from", str(ROOT / "README.md")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "not a calibration record" in p.stderr


def test_window_length_benchmark_shares_the_helpers():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import window_length as wl
    assert wl.window_value is wc.window_value and wl.member_record is wc.member_record
    with pytest.raises(ValueError, match="not divisible"):
        wc.sharded(resolve_here(base_config(ROOT / "x"), source="t").model, 3)


def test_window_auto_in_settings_and_in_what_the_jobs_resolve(tmp_path, pool_dir):
    from tptune.cli.main import _settings
    from tptune.records.run_dir import RunDir
    from tptune.errors import TptuneError

    cfg = base_config(pool_dir, ops=["qkv", "fc2"], tp_sizes=[2], op_settings={"fc2": {"timing": {"window_ms": 250}}})
    cfg["timing"]["window_ms"] = "auto"
    s = resolve_here(cfg, source="t")
    assert s.window_auto and s.op("qkv").timing.window_ms == "auto"
    w = s.with_window(750.0)
    assert not w.window_auto and w.op("qkv").timing.window_ms == 750.0
    assert w.op("fc2").timing.window_ms == 250          # an op's own number stays
    assert s.timing.window_ms == "auto"                    # a copy: s is unchanged
    only_op = resolve_here(deep_merge(base_config(pool_dir), {"op_settings": {"fc1": {"timing": {"window_ms": "auto"}}}}),
                           source="t")
    assert only_op.window_auto and only_op.with_window(1000.0).op("fc1").timing.window_ms == 1000.0
    # a job reads the run's config.json; a measuring job cannot go on without the calibration
    run_json = tmp_path / "config.json"
    run_json.write_text(json.dumps(cfg))
    with pytest.raises(TptuneError, match="calibration/window.json holds no calibrated window"):
        _settings(str(run_json), check_hardware=True)
    assert _settings(str(run_json)).window_auto                          # bookkeeping: left as it is
    RunDir(tmp_path).calibration_dir.mkdir()
    RunDir(tmp_path).calibration_json.write_text(json.dumps({"window_ms": 1000.0}))
    assert _settings(str(run_json), check_hardware=True).op("qkv").timing.window_ms == 1000.0
    assert _settings(str(run_json), calibrated=False).window_auto


def test_the_rule_s_cli_on_cpu_writes_a_record_that_measures_nothing(tmp_path, pool_dir):
    cfg = base_config(pool_dir, ops=["qkv"], tp_sizes=[2])
    cfg["timing"]["window_ms"] = "auto"
    cfg["model"] = str(ROOT / "config/models/tiny.yaml")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = subprocess.run([sys.executable, "-m", "tptune", "calibrate-window", "--run-config", str(tmp_path / "config.json")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    rec = json.loads((tmp_path / "calibration/window.json").read_text())
    assert rec["window_ms"] == 500.0 and rec["members"] == {} and rec["device"] == "cpu"
    assert "chosen: 500 ms: CPU" in p.stdout
    p = subprocess.run([sys.executable, "-m", "tptune", "calibrate-window", "x.yaml", "--run-config",
                        str(tmp_path / "config.json")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2 and "not both" in p.stderr


def test_lead_in_benchmark_arithmetic_and_its_committed_h100_run():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import lead_in
    first = {0: 0.98, 1: 1.0, 2: 1.0, 3: 1.0}
    second = {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0}
    assert lead_in.first_member_effect(first, second) == pytest.approx(math.log(0.98))
    assert lead_in.first_member_effect({1: 1.0, 2: 1.0, 3: 1.0}, second) is None      # no round 0
    assert lead_in.first_member_effect({0: 1.0, 1: 1.0}, second) is None              # under 3 rounds
    s = lead_in.summarize({"lead-in": [-0.06, -0.05, -0.07], "none": []})
    assert s["lead-in"]["n"] == 3 and s["lead-in"]["lo"] < s["lead-in"]["effect"] < s["lead-in"]["hi"] < 0
    assert s["none"]["n"] == 0 and s["none"]["effect"] is None
    rec = json.loads((ROOT / "results/lead-in-h100/lead-in-h100.json").read_text())
    again = lead_in.summarize({arm: [x["effect"] for x in rec["sessions"] if x["arm"] == arm and x["effect"] is not None]
                               for arm in ("lead-in", "none")})
    assert again["lead-in"]["n"] == again["none"]["n"] == 12
    assert again["lead-in"]["hi"] < 0 < again["none"]["lo"]                  # the lead-in made round 0 worse
    assert again["lead-in"]["effect"] == pytest.approx(rec["summary"]["lead-in"]["effect"])


@pytest.mark.slow
def test_a_failing_member_is_recorded_and_the_other_ops_still_calibrate(tmp_path, pool_dir):
    from tptune.measure.launch import Launcher

    cfg = base_config(pool_dir, ops=["qkv", "fc2"], tp_sizes=[2], faults={"fc2-tp1-nocomm": "raise:0"})
    cfg["timing"].update(iters=8, warmup=1)
    s = resolve_here(cfg, source="test")
    rec = wc.calibrate(s, Launcher(s), candidates=[5.0, 20.0], rounds=3, work_dir=tmp_path)
    assert set(rec["failed"]) == {"fc2"} and "injected failure on rank 0" in rec["failed"]["fc2"]["fc2-tp1-nocomm"]
    assert set(rec["members"]) == {"qkv"}
    assert all(set(r["per_op"]) == {"qkv"} and r["df"] == 2 for r in rec["table"])
    assert rec["window_ms"] in (5.0, 20.0)
    assert "fc2: not measured (fc2-tp1-nocomm: " in wc.format_table(rec)
