"""The progress line (cli.progress) from a run folder's real files: progress.jsonl (records.progress),
wall_predicted.json and the sessions' session.json, written here as the workflow writes them."""
import json
import os
import subprocess
import sys

import pytest

from tptune.cli.progress import estimate, line, time_left
from tptune.records import progress
from tptune.records.run_dir import RunDir
from tptune.search.ahead import Ahead

T0 = 1_700_000_000.0


def _ahead(n, final=False):
    return Ahead(frozenset(f"fc1/tp2/knobs/step{k}" for k in range(n)), final)


def _run(tmp_path, sessions=(), start=T0) -> RunDir:
    """A run whose invocation started at ``start`` and finished ``sessions`` ((name, started, wall_s))."""
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    if start is not None:
        progress.record_start(run, now=start)
    for name, started, wall in sessions:
        progress.record_session(run, name, {"tp": 2, "started": started, "wall_s": wall}, now=started + wall)
    return run


def _predict(run, wall_s, sessions, **extra):
    run.wall_predicted_json.write_text(json.dumps({"gpus": 4, "sessions_planned": sessions,
                                                   "predicted_wall_s": wall_s, "basis": "test", **extra}))


THREE = [("qkv/tp2/knobs/step0", T0 + 5, 10.0), ("proj/tp2/knobs/step0", T0 + 16, 10.0),
         ("qkv/tp2/knobs/step1", T0 + 27, 8.0)]


def test_without_a_prediction_the_pace_so_far_times_what_is_planned(tmp_path):
    run = _run(tmp_path, THREE)
    est = estimate(run, _ahead(9), now=T0 + 36)
    assert (est.done, est.planned, est.elapsed_s) == (3, 12, 36)
    assert est.left_s == pytest.approx(36 / 3 * 9)
    assert line("qkv/tp2/knobs/step1", 8.04, est) == (
        "tptune: session 3/12 done (qkv tp2 knobs step1, 8.0 s) · 36 s elapsed · about 1 min 48 s left")


def test_a_prediction_leads_early_and_the_pace_takes_over(tmp_path):
    run = _run(tmp_path, THREE)
    _predict(run, 400, 40)
    est = estimate(run, _ahead(9), now=T0 + 36)
    # planned: the prediction's 40 sessions (more than the 12 the records know of); 3/40 done
    assert (est.done, est.planned) == (3, 40)
    f = 3 / 40
    assert est.left_s == pytest.approx((1 - f) * 400 * (1 - f) + f * 36 / 3 * 37)
    # a run on the predicted pace is told the prediction's time for the rest, exactly
    assert time_left(10, 40, 100.0, 400.0) == pytest.approx(300.0)
    # at the end only the measured pace counts
    assert time_left(40, 40, 800.0, 400.0) == 0
    assert time_left(39, 40, 780.0, 400.0) == pytest.approx((1 / 40) ** 2 * 400 + 39 / 40 * 20)
    # once every search is over the records' count is the whole plan: the prediction's no longer raises it
    assert estimate(run, _ahead(2, True), now=T0 + 36).planned == 5


def test_a_rerun_is_timed_by_its_own_pace_not_the_whole_runs_prediction(tmp_path):
    run = _run(tmp_path, [], start=None)
    old = run.step_session("fc1", 2, "knobs", 0)
    old.mkdir(parents=True)
    (old / "session.json").write_text("{}")
    os.utime(old / "session.json", (T0 - 3600, T0 - 3600))      # measured an hour before this invocation
    # snakemake -R: its DAG re-measures two recorded sessions, which the records cannot tell
    progress.record_start(run, now=T0, sessions=["qkv/tp2/point", "layer/tp2"])
    progress.record_session(run, "qkv/tp2/point", {"tp": 2, "started": T0 + 2, "wall_s": 6.0}, now=T0 + 8)
    _predict(run, 400, 40)
    est = estimate(run, _ahead(0, True), now=T0 + 10)
    assert (est.done, est.planned, est.elapsed_s) == (1, 2, 10)
    assert est.left_s == pytest.approx(10.0)
    assert line("qkv/tp2/point", 6.0, est) == (
        "tptune: session 1/2 done (qkv tp2 point, 6.0 s) · 10 s elapsed · about 10 s left")


def test_only_the_latest_invocation_counts(tmp_path):
    run = _run(tmp_path, THREE)
    progress.record_start(run, now=T0 + 1000)
    progress.record_session(run, "layer/tp2", {"tp": 2, "started": T0 + 1001, "wall_s": 20.0}, now=T0 + 1021)
    est = estimate(run, _ahead(0, True), now=T0 + 1021)
    assert (est.done, est.planned, est.elapsed_s) == (1, 1, 21)
    assert line("layer/tp2", 20.0, est).endswith("· 21 s elapsed · no session left: the report follows")


def test_broken_files_drop_only_the_estimate(tmp_path):
    run = _run(tmp_path, THREE)
    with open(run.progress_jsonl, "a") as fh:
        fh.write('{"event": "session", "session": "fc1/tp2/kno\n')      # a torn line, then one not JSON
        fh.write("not json\n")
    run.wall_predicted_json.write_text("{garbled")
    est = estimate(run, None, now=T0 + 36)
    assert (est.done, est.planned, est.left_s) == (3, None, None)
    assert line("qkv/tp2/knobs/step1", 8.0, est) == (
        "tptune: session 3 done (qkv tp2 knobs step1, 8.0 s) · 36 s elapsed · time left unknown")
    _predict(run, "soon", 40)     # not a number: no prediction
    assert estimate(run, _ahead(9), now=T0 + 36).planned == 12
    # sessions measured by hand, no invocation recorded: counted from the first session's start
    (tmp_path / "bare").mkdir()
    bare = _run(tmp_path / "bare", [("qkv/tp2/point", T0, 4.0)], start=None)
    est = estimate(bare, _ahead(0), now=T0 + 5)
    assert line("qkv/tp2/point", 4.0, est) == ("tptune: session 1/1 done (qkv tp2 point, 4.0 s) · 5.0 s elapsed "
                                                "since the first session · no further session known yet")


def test_sessions_finished_at_once_append_whole_lines(tmp_path):
    """Jobs that finish sessions at once (TP 2 on two GPU pairs) each append their lines: every line comes
    out whole (one O_APPEND write each), none lost."""
    run = _run(tmp_path)
    code = ("import sys; from tptune.records import progress; from tptune.records.run_dir import RunDir\n"
            "run = RunDir(sys.argv[1])\n"
            "for i in range(200):\n"     # lines longer than a pipe's atomic 4 KiB, as a torn write would show
            "    progress.append(run.progress_jsonl, {'event': 'session', 'session': f'w{sys.argv[2]}/tp2/knobs/step{i}',"
            " 'started': 1.0, 'wall_s': 2.0, 'finished': 3.0, 'pad': 'x' * 6000})\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(run.root), str(w)]) for w in range(4)]
    assert all(p.wait(timeout=60) == 0 for p in procs)
    lines = run.progress_jsonl.read_text().splitlines()
    assert len(lines) == 1 + 4 * 200
    events = [json.loads(x) for x in lines]
    assert sorted(e["session"] for e in events[1:]) == sorted(f"w{w}/tp2/knobs/step{i}" for w in range(4)
                                                              for i in range(200))
    assert len(progress.current(run).sessions) == 800


def test_the_confirm_stage_after_the_sessions_is_counted_until_it_has_run(tmp_path):
    """wall_predicted.json's confirm_s (the plan counts the stage, te) follows the sessions: the sessions' time
    left is timed against the prediction without it, the stage's seconds are added, and the last session's line
    says it follows; once confirm.json is written nothing is added."""
    run = _run(tmp_path, THREE)
    _predict(run, 800, 40, confirm_s=400)
    est = estimate(run, _ahead(9), now=T0 + 36)
    f = 3 / 40
    assert est.confirm_s == 400
    assert est.left_s == pytest.approx((1 - f) * 400 * (1 - f) + f * 36 / 3 * 37 + 400)
    end = estimate(run, _ahead(0, True), now=T0 + 36)
    assert end.planned == end.done == 3 and end.left_s == pytest.approx(400)
    assert line("qkv/tp2/knobs/step1", 8.0, end).endswith(
        "no session left: the confirm stage (about 6 min 40 s) and the report follow")
    run.confirm_json.write_text("{}")
    done = estimate(run, _ahead(0, True), now=T0 + 36)
    assert done.confirm_s == 0 and done.left_s == 0
    assert line("qkv/tp2/knobs/step1", 8.0, done).endswith("no session left: the report follows")
