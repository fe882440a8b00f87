"""The report's wall-time line (report.wall_time) from a run folder's real files, each present or not."""
import json
import shutil

from tptune.records import progress
from tptune.records.run_dir import RunDir
from tptune.report.wall_time import wall_time_line

from conftest import ROOT

T0 = 1_700_000_000.0


def test_nothing_recorded_says_what_is_missing(tmp_path):
    assert wall_time_line(RunDir(tmp_path)) == ("**Wall time**: measured: not recorded (no `wall_s.txt`, no session "
                                                "in `progress.jsonl`); predicted: no `wall_predicted.json`.")


def test_a_committed_run_gives_its_timed_wall_seconds(tmp_path):
    run = RunDir(tmp_path / "run")
    shutil.copytree(ROOT / "results" / "knobs-mixtral-8x7b-h200x2", run.root,
                    ignore=shutil.ignore_patterns("sessions", "analysis", "*.parquet", "*.png"))
    assert run.wall_s_txt.read_text().strip() == "120"
    assert wall_time_line(run) == "**Wall time**: measured 120 s (`wall_s.txt`); predicted: no `wall_predicted.json`."
    run.wall_predicted_json.write_text(json.dumps({"gpus": 2, "sessions_planned": 13, "predicted_wall_s": 150.4,
                                                   "basis": "the sessions of knobs-mixtral-8x7b-h200x2",
                                                   "per_tp": {"2": {"sessions": 13}}}))
    run.wall_8gpu_predicted_txt.write_text("96\n")
    assert wall_time_line(run) == (
        "**Wall time**: measured 120 s (`wall_s.txt`); predicted 150 s on 2 GPUs, measured / predicted 0.80 "
        "(`wall_predicted.json`: the sessions of knobs-mixtral-8x7b-h200x2); an 8-GPU node predicted 96 s "
        "(`wall_s.8gpu-predicted.txt`: this run's sessions laid on 8 GPUs, not measured).")
    # a run that measured TP 2 and 4: tptune predict extrapolated TP 8 for the 8-GPU node, and the line says so
    sessions = [{"tp": 2}, {"tp": 4}]
    assert wall_time_line(run, sessions).endswith(
        "an 8-GPU node 96 s (`wall_s.8gpu-predicted.txt`), an extrapolation: TP 8 was not measured, its sessions are "
        "TP 4's scaled by each op's TP 4 / TP 2 ratio (`tptune predict` prints them).")


def test_a_plain_snakemake_run_is_timed_by_its_progress_record(tmp_path):
    run = RunDir(tmp_path)
    progress.record_start(run, now=T0)
    progress.record_session(run, "qkv/tp2/point", {"tp": 2, "started": T0 + 3, "wall_s": 5.0}, now=T0 + 8)
    progress.record_session(run, "layer/tp2", {"tp": 2, "started": T0 + 9, "wall_s": 20.0}, now=T0 + 29.4)
    assert wall_time_line(run) == (
        "**Wall time**: measured 29 s (`progress.jsonl`, from the run's start to its last session's end; the jobs "
        "after that not counted); predicted: no `wall_predicted.json`.")
    progress.record_start(run, now=T0 + 100)        # a second invocation re-measured one session
    progress.record_session(run, "layer/tp2", {"tp": 2, "started": T0 + 102, "wall_s": 10.0}, now=T0 + 112)
    run.wall_predicted_json.write_text("[]")        # not a prediction
    assert wall_time_line(run).startswith(
        "**Wall time**: measured 41 s (`progress.jsonl`, over 2 snakemake invocations, each from its start to its "
        "last session's end; the jobs after that not counted); predicted: no `wall_predicted.json`")
    run.wall_s_txt.write_text("130\n")
    assert wall_time_line(run).startswith("**Wall time**: measured 130 s (`wall_s.txt`)")


def test_a_workflow_run_confirm_stage_is_named_and_a_prediction_without_it_compared_without_it(tmp_path):
    """The Mistral run (results/confirm-mistral-small-24b-h200x4): its workflow ran the confirm stage, and its
    wall_predicted.json was written before the plan counted the stage: the line says how much the stage took and
    compares the prediction with the measured time less the stage; a prediction that counts it (confirm_s) is
    compared with the whole."""
    run = RunDir(tmp_path / "run")
    shutil.copytree(ROOT / "results" / "confirm-mistral-small-24b-h200x4", run.root,
                    ignore=shutil.ignore_patterns("sessions", "analysis", "*.parquet", "*.png", "search", "logs"))
    wall = float(run.wall_s_txt.read_text())
    stage = json.loads(run.confirm_json.read_text())["wall_s"]
    pred = json.loads(run.wall_predicted_json.read_text())
    assert "confirm_s" not in pred
    line = wall_time_line(run)
    assert f"measured {wall:.0f} s (`wall_s.txt`); of which the confirm stage {stage:.0f} s (`confirm.json`)" in line
    assert (f"predicted {pred['predicted_wall_s']:.0f} s on 4 GPUs without the confirm stage (the prediction did "
            f"not count it), measured less the stage / predicted {(wall - stage) / pred['predicted_wall_s']:.2f}") in line
    run.wall_predicted_json.write_text(json.dumps({**pred, "predicted_wall_s": 736, "confirm_s": 380}))
    assert f"predicted 736 s on 4 GPUs, measured / predicted {wall / 736:.2f}" in wall_time_line(run)
