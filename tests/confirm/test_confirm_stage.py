"""The confirm stage end to end on a copy of a committed GPU run (results/tp24-llama3-70b-h200x4/rep1), with the
format-true stand-in for Megatron-LM on GPUs (standin_trainer.py) as each launch: the rotation, the preset chosen
from the layer record, the ratios, the loss rule failing the set loudly, a failed launch recorded while the rest
goes on, confirm.json, and `tptune confirm`'s exit status."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

RUN = ROOT / "results" / "tp24-llama3-70b-h200x4" / "rep1"
STANDIN = f"{{python}} {Path(__file__).with_name('standin_trainer.py')}"


def _copy(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(RUN, dst, ignore=shutil.ignore_patterns("sessions", "analysis", "search", "figures", "logs",
                                                            "*.parquet", "*.csv"))
    return dst


def _confirm(run, *args, **env):
    return subprocess.run([sys.executable, "-m", "tptune", "confirm", str(run), "--launcher", STANDIN, *args],
                          capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_rounds_rotate_and_the_ratios_and_loss_are_recorded(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(run, "--rounds", "3", "--iters", "12")
    assert p.returncode == 0, p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    order = [(x["round"], x["setting"]) for x in rec["launches"]]
    assert order == [(0, "set"), (0, "preset"), (0, "none"), (1, "preset"), (1, "none"), (1, "set"),
                     (2, "none"), (2, "set"), (2, "preset")]
    assert rec["settings"]["preset"]["preset"] == "nvidia_bf16_tp2" and rec["tp"] == 4 and rec["layers"] == 2
    assert all((run / x["log"]).is_file() for x in rec["launches"])
    r = rec["ratios"]["set/none"]
    assert r["rounds"] == 3 and 0.96 < r["ratio"] < 0.98        # the stand-in runs the set at 0.97 of none
    assert rec["loss_ok"] is True and rec["loss_failures"] == [] and rec["launch_failures"] == []
    assert rec["layers_share"]["from"] == "layer/tp4.json layer-tp4-ub.tuned_tp4" and rec["wall_s"] > 0
    assert "set / nvidia_bf16_tp2: 0.98" in p.stdout


def test_a_loss_beyond_repeat_noise_fails_the_set_loudly(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(run, "--rounds", "2", "--iters", "12", STANDIN_LOSS_SHIFT="1e-3")
    assert p.returncode == 1 and "THE LOSS DIFFERS FROM NO OVERLAP'S" in p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    assert rec["loss_ok"] is False and rec["numerics"]["set"]["loss"]["difference"] == 0.001
    assert _confirm(run, "--rounds", "1", "--iters", "12", "--exit-zero", STANDIN_LOSS_SHIFT="1e-3").returncode == 0


def test_a_failed_launch_is_recorded_and_the_rest_goes_on(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(run, "--rounds", "2", "--iters", "12", STANDIN_FAIL="nvidia_bf16_tp2.yaml")
    assert p.returncode == 0, p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    bad = [x for x in rec["launches"] if x["status"] != "ok"]
    assert [x["setting"] for x in bad] == ["preset", "preset"] and len(rec["launches"]) == 6
    assert bad[0]["failure"]["kind"] == "userbuffers" and "ub_comm init failed" in bad[0]["failure"]["lines"][0]
    assert rec["ratios"]["set/preset"] is None and rec["ratios"]["set/none"]["rounds"] == 2
    assert "launch failed: preset round 0: userbuffers" in p.stderr


def test_a_machine_that_cannot_run_the_stage_says_why_and_the_workflows_rule_goes_on(tmp_path):
    """This CPU host has no CUDA GPU (and, unless tests/confirm's parser check put it on the path, no
    megatron.training): `tptune confirm` refuses with the reasons and writes nothing; with --exit-zero (the
    workflow's rule: the stage is on by default with te) confirm.json says why and the report shows it."""
    run = _copy(tmp_path)
    before = json.loads((run / "confirm.json").read_text())
    cmd = [sys.executable, "-m", "tptune", "confirm", str(run), "--rounds", "1"]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "cannot run on this machine" in p.stderr and "TP 4 needs 4" in p.stderr
    assert json.loads((run / "confirm.json").read_text()) == before          # a recorded stage is not lost
    (run / "confirm.json").unlink()
    p = subprocess.run(cmd + ["--exit-zero"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    assert "0 CUDA GPUs here; TP 4 needs 4" in rec["not_run"] and "launches" not in rec
    import jinja2

    from tptune.records.run_dir import RunDir
    from tptune.report.confirm_section import confirm_headline, confirm_section
    from tptune.report.render import TEMPLATES

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined)
    assert confirm_section(env, RunDir(run)).startswith(
        "## In Megatron-LM's training loop\n\nNot confirmed: the confirm stage cannot run on this machine")
    assert confirm_headline(RunDir(run)) == "**In Megatron-LM's training loop**: not confirmed (see its section below)."
