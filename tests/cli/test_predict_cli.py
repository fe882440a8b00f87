"""tptune predict (a committed run's sessions on 8 GPUs, the file beside wall_s.txt), tptune plan's
wall_predicted.json, and snakemake -n's line, through the real commands."""
import json
import os
import re
import shutil
import subprocess
import sys

import yaml

from conftest import ROOT, base_config, copy_workflow

RUN = ROOT / "results" / "tp24-llama3-70b-h200x4" / "rep1"


def tptune(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "tptune", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def test_predict_writes_the_8gpu_figure_beside_wall_s(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "wall_s.txt"):
        shutil.copy(RUN / name, run / name)
    shutil.copytree(RUN / "sessions", run / "sessions")
    p = tptune("predict", str(run), "--gpus", "8", "--tp-sizes", "2,4,8")
    assert p.returncode == 0, p.stderr
    first = p.stdout.splitlines()[0]
    assert "on 8 GPUs, TP 2, 4, 8:" in first and "(measured on its own node: 349 s)" in first
    assert "  TP 8:" in p.stdout and "extrapolated: TP 8:" in p.stdout and "start-up and tail" in p.stdout
    written = (run / "wall_s.8gpu-predicted.txt").read_text()
    assert written == re.search(r"TP 2, 4, 8: (\d+) s", first).group(1) + "\n"
    assert written == (RUN / "wall_s.8gpu-predicted.txt").read_text()      # the committed one
    own = tptune("predict", str(run), "--no-write")
    assert own.returncode == 0 and "on 4 GPUs, TP 2, 4:" in own.stdout
    assert not (run / "wall_s.4gpu-predicted.txt").exists()


def test_predict_says_what_it_cannot_do(tmp_path):
    p = tptune("predict", str(ROOT / "results" / "qwen2.5-32b-h200x4-tp4"), "--gpus", "8", "--tp-sizes", "2,4,8",
               "--no-write")
    assert p.returncode == 2 and "TP 2 was not measured" in p.stderr and "Traceback" not in p.stderr
    p = tptune("predict", str(tmp_path))
    assert p.returncode == 2 and "not a run folder" in p.stderr


def test_plan_writes_the_prediction_before_measuring(tmp_path, pool_dir):
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(base_config(pool_dir)))
    out = tmp_path / "outputs" / "r" / "plan.parquet"
    out.parent.mkdir(parents=True)
    p = tptune("plan", "--config", str(tmp_path / "run.yaml"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    rec = json.loads((out.parent / "wall_predicted.json").read_text())
    assert {"gpus", "sessions_planned", "predicted_wall_s", "basis", "per_tp"} <= set(rec)
    assert rec["rough"] and set(rec["per_tp"]) == {"2", "4"}
    assert f"{rec['predicted_wall_s']} s for {rec['sessions_planned']} planned sessions" in p.stdout


def test_a_dry_run_prints_the_prediction_and_writes_nothing(tmp_path, pool_dir):
    copy_workflow(tmp_path)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(base_config(pool_dir)))
    p = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--cores", "2", "--configfile", "run.yaml"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"})
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [x for x in (p.stdout + p.stderr).splitlines() if "predicted wall time on this node" in x]
    assert len(lines) == 1 and "worker slots; rough: costed as on GPUs" in lines[0] and "at most" in lines[0]
    assert not (tmp_path / "outputs").exists()


def _copied_run(tmp_path, model=None):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("config.json", "wall_s.txt"):
        shutil.copy(RUN / name, run / name)
    shutil.copytree(RUN / "sessions", run / "sessions")
    if model:
        rec = json.loads((RUN / "model.json").read_text())
        rec["model"].update(model)
        (run / "model.json").write_text(json.dumps(rec))
    return run


def test_predict_refuses_a_node_its_sessions_do_not_fit_in_one_line(tmp_path):
    """Issue 54 item 7: --gpus 3 was a ValueError traceback from the simulation (a TP 2 session needs an
    aligned block of 2), and --gpus 100000000 hung laying out a hundred million GPUs."""
    run = _copied_run(tmp_path)
    p = tptune("predict", str(run), "--gpus", "3", "--no-write")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "no measured TP fits 3 GPUs" in p.stderr and "a multiple of" in p.stderr, p.stderr
    p = tptune("predict", str(run), "--gpus", "6", "--tp-sizes", "2,4", "--no-write")
    assert p.returncode == 2 and "--tp-sizes: TP 4 does not fit 6 GPUs" in p.stderr, p.stderr
    p = tptune("predict", str(run), "--gpus", "100000000", "--no-write")
    assert p.returncode == 2 and "--gpus 100000000: expected a number of GPUs from 1 to 1024" in p.stderr, p.stderr


def test_predict_plans_no_tp_the_model_cannot_run(tmp_path):
    """Issue 54 item 7: predict extrapolated to TP 8 for a model `tptune validate` refuses at TP 8 (here the
    run's model.json with 4 KV groups): a TP the model cannot run is left out, and refused when asked for."""
    run = _copied_run(tmp_path, model={"num_query_groups": 4})
    p = tptune("predict", str(run), "--gpus", "8", "--no-write")
    assert p.returncode == 0, p.stderr
    assert "on 8 GPUs, TP 2, 4:" in p.stdout.splitlines()[0], p.stdout
    assert "note: TP 8 left out: TP=8: num_query_groups=4 is not divisible by 8" in p.stdout, p.stdout
    p = tptune("predict", str(run), "--gpus", "8", "--tp-sizes", "2,4,8", "--no-write")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--tp-sizes: TP=8: num_query_groups=4 is not divisible by 8" in p.stderr, p.stderr
