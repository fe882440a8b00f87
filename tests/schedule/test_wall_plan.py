"""The wall time predicted before measuring: the committed fit is benchmarks/wall_fit.py's fit of results/,
and tptune plan's estimate (the search's planned sessions costed with it, laid on the node) is close to
what the committed runs measured."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from tptune.measure.preflight import resolve_here
from tptune.records.run_dir import RunDir
from tptune.schedule.accuracy import run_figures
from tptune.schedule.plan_estimate import estimate, planned_sessions
from tptune.schedule.replay import predict
from tptune.schedule.wall_fit import fit, fitted_runs, load_table
from tptune.settings.resolve import load_config_files, load_run_config

RESULTS = ROOT / "results"


def _settings(run_dir):
    cfg, source, _ = load_run_config([run_dir / "config.json"])
    return resolve_here(cfg, source=source, base_dir=ROOT, check_hardware=False)


def test_the_committed_table_is_the_fit_of_the_committed_runs():
    assert load_table() == fit(RESULTS), "results/ changed: python benchmarks/wall_fit.py --write"


def test_the_committed_replays_are_todays_replay_of_each_fitted_run():
    """docs/wall-time.md quotes results/wall_replay.json: how close each run replays to its wall_s.txt (a check
    of the scheduler), its prediction before measuring (the accuracy a user gets) and the factors its 8-GPU
    extrapolation scales TP 4's sessions by (schedule.accuracy)."""
    committed = json.loads((RESULTS / "wall_replay.json").read_text())
    now = run_figures(RESULTS, load_table(), ROOT)
    assert {k: committed[k] for k in now} == now, "results/ changed: python benchmarks/wall_fit.py --write"
    assert len(now["runs"]) == len(fitted_runs(RESULTS)[0])
    # every TP 2 + 4 run that wrote an 8-GPU figure extrapolated TP 8, by its own factors
    tp24 = RESULTS / "tp24-llama3-70b-h200x4" / "rep2"
    p = predict(RunDir(tp24), 8)
    assert p.tp_sizes == [2, 4, 8] and now["tp8"]["tp24-llama3-70b-h200x4/rep2"] == {
        "lo": round(p.extrapolation_range[0], 3), "hi": round(p.extrapolation_range[1], 3)}
    assert p.lines()[0].startswith(f"{tp24}: extrapolated wall time on 8 GPUs") and "an extrapolation" in p.lines()[1]
    own = predict(RunDir(tp24))
    assert own.extrapolation_range is None and own.own_node and "a check of the scheduler" in own.lines()[1]


def test_the_benchmark_prints_the_fit_and_each_runs_predictions():
    """... and before measuring, the committed runs are predicted within a third (median over every fitted
    run; the planned search is the one where nothing moves, so it tends to run long)."""
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "wall_fit.py")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert "s per member-round" in p.stdout and "tp24-llama3-70b-h200x4/rep1" in p.stdout
    assert "before measuring: median error" in p.stdout
    # what a new run gets (the te defaults' search and budget) is predicted within a quarter (median)
    line = next(x for x in p.stdout.splitlines() if "with the te defaults' search and budget" in x)
    assert int(line.split("median error ")[1].split("%")[0]) <= 25, line
    assert len(fitted_runs(RESULTS)[0]) >= 15


def test_planned_sessions_follow_the_search(tmp_path):
    run = RESULTS / "knobs-llama3-70b-h100x4-tp4"
    s = _settings(run)
    _, planned = planned_sessions(s, load_table())
    names = [x.name for x in planned]
    # the knob planner where nothing moves: as many steps as benchmarks/knob_sessions.py counts
    given = {k: v for k, v in json.loads((run / "config.json").read_text()).items() if not k.startswith("_")}
    (tmp_path / "run.yaml").write_text(json.dumps(given))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "knob_sessions.py"), str(tmp_path / "run.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for line in out.stdout.splitlines():
        if "all ops" in line or "sessions" not in line:
            continue
        tp, op, n = line.split()[0].split("=")[1], line.split()[1], int(line.split()[2])
        assert sum(1 for x in names if x.startswith(f"{op}/tp{tp}/knobs/step")) == n
    assert [x for x in names if "/point" in x] == [f"{op}/tp4/point" for op in s.ops]
    assert names[-1] == "layer/tp4"
    rec = estimate(s).as_record()
    assert rec["gpus"] == 4 and rec["sessions_planned"] == len(planned) and not rec["rough"]
    assert rec["per_tp"]["4"]["sessions"] == len(planned) and rec["per_tp"]["4"]["blocks"] == 1


def test_the_cpu_default_is_predicted_and_said_to_be_rough():
    s = resolve_here(load_config_files(ROOT / "config" / "config.yaml"), check_hardware=False)
    est = estimate(s)
    rec = est.as_record()
    assert rec["rough"] and "rough" in rec["basis"] and "rough" in est.line()
    assert set(rec["per_tp"]) == {str(t) for t in s.tp_sizes}
    assert rec["predicted_wall_s"] > 0
    json.dumps(rec)


@pytest.mark.parametrize("bad", [None, object()])
def test_the_dry_run_line_never_raises(bad):
    from tptune.cli.wall import dry_run_line

    assert dry_run_line(bad).startswith("tptune: no wall-time prediction (")


def test_the_confirm_stage_is_counted_where_it_runs():
    """The Mistral run's config (te, confirm on by default) is predicted with the confirm stage: its fewest rounds x 4
    launches (or its budget where longer), each the committed launches' median start-up plus its iterations at their median; the fit is of
    every committed confirm.json's launches that ran, and the same config with the stage off predicts that much
    less. The fit leaves the stage out of the time outside the sessions (its run's wall_s.txt holds it)."""
    run = RESULTS / "confirm-mistral-small-24b-h200x4"
    s = _settings(run)
    assert s.backend == "te" and s.confirm.enabled
    table = load_table()
    c = table["confirm"]
    launches = [x for p in sorted(RESULTS.glob("**/confirm.json")) for x in json.loads(p.read_text()).get("launches", [])
                if x["status"] == "ok"]
    assert c["launches"] == len(launches) >= 18
    est = estimate(s, table=table)
    per = c["launch_start_s"] + s.confirm.iters * c["iteration_s"]
    assert est.confirm_s == pytest.approx(max(s.confirm.rounds * 4 * per, s.confirm.budget_s))
    assert f"the confirm stage {est.confirm_s:.0f} s of it" in est.line() and est.as_record()["confirm_s"] > 0
    cfg, source, _ = load_run_config([run / "config.json"])
    off = estimate(resolve_here({**cfg, "confirm": {**cfg["confirm"], "enabled": False}}, source=source, base_dir=ROOT,
                                check_hardware=False), table=table)
    assert off.confirm_s == 0 and est.predicted_wall_s - off.predicted_wall_s == pytest.approx(est.confirm_s)
    wall = float((run / "wall_s.txt").read_text())
    assert abs(est.predicted_wall_s / wall - 1) < 0.25          # 736 s against the measured 774 s
