"""The confirm stage end to end on a copy of a committed GPU run (results/tp24-llama3-70b-h200x4/rep1), with real
subprocesses: torch.distributed.run starts the launch group's rank runners (confirm.rank_runner), and each launch
runs a Megatron-LM "checkout" (--megatron-lm) whose pretrain_gpt.py is the format-true stand-in for Megatron-LM on
GPUs (standin_trainer.py). Checked: the rotation over the four arms (the set, the best preset, nemo_tp4, none), the
ratios, the loss rule failing the set loudly, a failed launch recorded while the rest goes on, rounds added until
the target or the cap, a cut stage resumed with only its missing launches, confirm.json, and the exit status."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import ROOT

RUN = ROOT / "results" / "tp24-llama3-70b-h200x4" / "rep1"
LAUNCHER = "{python} -m torch.distributed.run --nproc-per-node {nproc} --master-port {port} {entry}"


def _copy(tmp_path) -> Path:
    dst = tmp_path / "run"
    shutil.copytree(RUN, dst, ignore=shutil.ignore_patterns("sessions", "analysis", "search", "figures", "logs",
                                                            "*.parquet", "*.csv", "confirm"))
    return dst


def _checkout(tmp_path) -> Path:
    ck = tmp_path / "megatron-lm"
    (ck / "megatron" / "training").mkdir(parents=True, exist_ok=True)
    standin = Path(__file__).with_name("standin_trainer.py")
    (ck / "pretrain_gpt.py").write_text(f"import runpy\nrunpy.run_path({str(standin)!r}, run_name='__main__')\n")
    return ck


def _cmd(tmp_path, run, *args):
    return [sys.executable, "-m", "tptune", "confirm", str(run), "--launcher", LAUNCHER, "--megatron-lm",
            str(_checkout(tmp_path)), "--iters", "12", "--tp", "2", *args]     # TP 2: two ranks a launch


def _confirm(tmp_path, run, *args, **env):
    return subprocess.run(_cmd(tmp_path, run, *args), capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})


def test_rounds_rotate_over_the_four_arms_and_the_ratios_and_loss_are_recorded(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(tmp_path, run, "--rounds", "2", "--max-rounds", "2")
    assert p.returncode == 0, p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    order = [(x["round"], x["setting"]) for x in rec["launches"]]
    assert order == [(0, "set"), (0, "preset"), (0, "nemo"), (0, "none"),
                     (1, "preset"), (1, "nemo"), (1, "none"), (1, "set")]
    assert rec["settings"]["preset"]["preset"] == "nvidia_bf16_tp2" and rec["settings"]["nemo"]["preset"] == "nemo_tp4"
    assert rec["tp"] == 2 and rec["layers"] == 2 and rec["group"]["mode"] == "fork"
    assert all((run / x["log"]).is_file() for x in rec["launches"])
    r = rec["ratios"]["set/none"]
    assert r["rounds"] == 2 and 0.96 < r["ratio"] < 0.98        # the stand-in runs the set at 0.97 of none
    assert 0.98 < rec["ratios"]["set/nemo"]["ratio"] < 0.99
    assert rec["loss_ok"] is True and rec["loss_failures"] == [] and rec["launch_failures"] == []
    assert rec["projected"]["set/nemo"]["kind"] == "projection" and rec["projected"]["set/nemo"]["layers"] == 80
    assert rec["stopped"] == "the round cap (2)" and rec["entry"].endswith("pretrain_gpt.py")
    assert "over_budget" not in rec
    assert "set / nvidia_bf16_tp2: 0.98" in p.stdout and "projected to 80 layers" in p.stdout


def test_rounds_are_added_until_the_target_and_an_unresolved_stage_says_what_it_would_need(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(tmp_path, run, "--rounds", "2", "--max-rounds", "5", "--target", "0.05", "--budget", "1")
    rec = json.loads((run / "confirm.json").read_text())
    assert "over the 1 s budget" in rec["over_budget"]          # the fewest rounds run even so, and it says so
    assert p.returncode == 0 and rec["rounds"] == 2 and rec["stopped"].startswith("resolved")
    assert rec["resolution"]["resolved"] is True
    p = _confirm(tmp_path, run, "--rounds", "2", "--max-rounds", "3", "--target", "1e-3", "--iters", "11",
                 STANDIN_NOISE="0.05")
    rec = json.loads((run / "confirm.json").read_text())
    assert rec["rounds"] == 3 and rec["stopped"] == "the round cap (3)" and rec["resolution"]["resolved"] is False
    added = {x["setting"] for x in rec["launches"] if x["round"] == 2}
    assert "none" not in added and "set" in added          # an added round runs what its open pairs need
    need = rec["resolution"]["pairs"]["set/preset"]["rounds_needed"]
    assert need is None or need > 3
    assert "UNDECIDED" in p.stdout


def test_a_cut_stage_resumes_with_only_its_missing_launches(tmp_path):
    run = _copy(tmp_path)
    (run / "confirm.json").unlink()             # the committed stage's record
    proc = subprocess.Popen(_cmd(tmp_path, run, "--rounds", "2", "--max-rounds", "2"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env={**os.environ, "STANDIN_SLEEP": "1"})
    kept = run / "confirm" / "launches"
    deadline = time.monotonic() + 200
    while len(list(kept.glob("r*.json"))) < 3 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)             # the stage cut, as a time limit cuts it
    proc.wait()
    before = {p.name: p.stat().st_mtime_ns for p in kept.glob("r*.json")}
    assert len(before) >= 3 and not (run / "confirm.json").exists()
    p = _confirm(tmp_path, run, "--rounds", "2", "--max-rounds", "2")
    assert p.returncode == 0, p.stderr
    assert f"{len(before)} launches kept from a cut stage" in p.stdout
    rec = json.loads((run / "confirm.json").read_text())
    assert len(rec["launches"]) == 8 and rec["ratios"]["set/none"]["rounds"] == 2
    assert {n: (kept / n).stat().st_mtime_ns for n in before} == before      # kept, not run again
    ran = [line for line in p.stdout.splitlines() if line.startswith("  round ")]
    assert len(ran) == 8 - len(before)
    # another stage (other iterations) does not reuse them
    p = _confirm(tmp_path, run, "--rounds", "1", "--max-rounds", "1", "--iters", "14")
    assert "launch record(s) of an earlier stage with other settings removed" in p.stdout


def test_a_loss_beyond_repeat_noise_fails_the_set_loudly(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(tmp_path, run, "--rounds", "2", "--max-rounds", "2", STANDIN_LOSS_SHIFT="1e-3")
    assert p.returncode == 1 and "THE LOSS DIFFERS FROM NO OVERLAP'S" in p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    assert rec["loss_ok"] is False and rec["numerics"]["set"]["loss"]["difference"] == 0.001


def test_a_failed_launch_is_recorded_and_the_rest_goes_on(tmp_path):
    run = _copy(tmp_path)
    p = _confirm(tmp_path, run, "--rounds", "2", "--max-rounds", "2", STANDIN_FAIL="nvidia_bf16_tp2.yaml")
    assert p.returncode == 0, p.stderr
    rec = json.loads((run / "confirm.json").read_text())
    bad = [x for x in rec["launches"] if x["status"] != "ok"]
    assert [x["setting"] for x in bad] == ["preset", "preset"] and len(rec["launches"]) == 8
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


def test_ranks_that_cannot_import_the_entry_stop_the_stage_with_the_reason(tmp_path):
    """tptune's own entry needs megatron.training and TE, which this CPU host lacks: the launch group's ranks
    die at their imports, and the stage stops at once naming the import (exit 2; with --exit-zero confirm.json
    says so), instead of starting a group for every launch."""
    run = _copy(tmp_path)
    (run / "confirm.json").unlink()
    cmd = [sys.executable, "-m", "tptune", "confirm", str(run), "--launcher", LAUNCHER, "--iters", "12", "--tp", "2",
           "--rounds", "1", "--max-rounds", "1"]
    env = {**os.environ, "PYTHONPATH": ""}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 2 and "before they were ready" in p.stderr and "megatron" in p.stderr, p.stderr
    assert p.stdout.count("  round 0") == 0 and not (run / "confirm" / "launches").exists()
    p = subprocess.run(cmd + ["--exit-zero"], capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "before they were ready" in json.loads((run / "confirm.json").read_text())["not_run"]
