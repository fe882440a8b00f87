"""The benchmarks that measure nothing and re-derive from committed records run on today's code and give
what was committed (real subprocesses over results/): a change to a record's reader (e.g. the typed
measured point) that breaks one fails here, not on the next GPU lease."""
import json
import shutil
import subprocess
import sys

import pytest

from conftest import ROOT

RESULTS = ROOT / "results"
NOISE_X2 = ["noise-window500.json", "noise-window500-preroll1000.json", "noise-lease2-window500.json",
            "noise-lease3-window500-rounds2.json", "noise-lease4-window500-rounds3.json"]


def _run(*args, cwd=ROOT):
    p = subprocess.run([sys.executable, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.parametrize("args", [["figures_replay.py"], ["knob_evidence.py"], ["replay_stopping.py"],
                                  ["wall_fit.py"], ["numerics_calibration.py"],
                                  ["run_cost.py", "results/tp24-llama3-70b-h200x4/rep1"]],
                         ids=lambda a: a[0])
def test_a_rederiving_benchmark_runs_on_the_committed_results(args):
    out = _run(ROOT / "benchmarks" / args[0], *args[1:])
    assert out.strip()


def test_recipe_env_rederives_its_committed_pooled_ratios(tmp_path):
    run = tmp_path / "recipe-env"
    shutil.copytree(RESULTS / "recipe-env-h200x2", run)
    (run / "pooled.json").unlink()
    _run(ROOT / "benchmarks/recipe_env.py", run)
    assert json.loads((run / "pooled.json").read_text()) == json.loads(
        (RESULTS / "recipe-env-h200x2/pooled.json").read_text())


def test_window_replay_rederives_its_committed_table():
    out = _run(ROOT / "benchmarks/window_length.py", "--from-noise",
               *[RESULTS / "noise-x2" / f for f in NOISE_X2], "--windows", "100,200,300,400,500", "--skips", "0,100,200")
    committed = (RESULTS / "window-x2-replay/replay.txt").read_text().splitlines()
    assert out.splitlines()[:len(committed)] == committed
