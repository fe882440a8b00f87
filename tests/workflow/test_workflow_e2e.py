"""The workflow for real: Snakemake over the tiny model on CPU (gloo), then its rerun behaviour."""
import json
import re
import subprocess
import sys

import pytest
import yaml

from conftest import base_config, copy_workflow

pytestmark = pytest.mark.slow
RUN = "outputs/e2e"


def smk(workdir, *args, check=True):
    p = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "run.yaml", *args],
                       cwd=workdir, capture_output=True, text=True, timeout=900)
    if check and p.returncode:
        raise AssertionError(f"snakemake {args} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def planned_sessions(dry_run_text: str) -> list[tuple]:
    """(op, tp, session) of the measuring jobs a dry run lists: search steps ("<dim>/step<k>") and
    TP points ("point"), from their output lines."""
    steps = re.findall(r"^\s+output: \S*/search/(\w+)/tp(\d+)/([a-z_.]+/step\d+)\.json$", dry_run_text, re.M)
    points = [(op, tp, "point") for op, tp in
              re.findall(r"^\s+output: \S*/search/(\w+)/tp(\d+)/point\.json$", dry_run_text, re.M)]
    return sorted(steps + points)


def write_cfg(workdir, pool_dir, **over):
    cfg = base_config(pool_dir, **{"run": "e2e", "ops": ["qkv", "fc2"], "tp_sizes": [2],
                                   "search": {"chunks": [2, 4]}, "faults": {"fc2-tp2-chunked.n4": "raise:1"},
                                   **over})
    cfg["model"] = "config/models/tiny.yaml"
    (workdir / "run.yaml").write_text(yaml.safe_dump(cfg))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("wf")
    copy_workflow(workdir)
    pool = workdir / "pool"
    pool.mkdir()
    write_cfg(workdir, pool)
    dry = smk(workdir, "-n")
    (workdir / "console.txt").write_text(smk(workdir).stderr)     # what the person who ran it saw
    return workdir, pool, dry.stdout + dry.stderr


def test_dry_run_lists_measuring_jobs(finished):
    _, _, dry = finished
    assert ("qkv", "2", "chunks/step0") in planned_sessions(dry)
    assert "search_step" in dry and "checkpoint" in dry


def test_the_console_shows_each_finished_session_and_the_report_the_wall_time(finished):
    """One progress line per session the run measured, on Snakemake's console though each job's output
    goes to its log, counting up to the planned sessions with a time left; the report's wall-time line."""
    workdir, _, _ = finished
    run = workdir / RUN
    lines = re.findall(r"^tptune: session (\d+)/(\d+) done \(([a-z0-9_. ]+), [\d.]+ s\) · (\d+[^·]*) elapsed "
                       r"· (.+)$", (workdir / "console.txt").read_text(), re.M)
    sessions = sorted(str(p.parent.relative_to(run / "sessions")) for p in (run / "sessions").rglob("session.json"))
    assert sorted(name.replace(" ", "/") for _, _, name, _, _ in lines) == sessions
    assert [int(done) for done, *_ in lines] == list(range(1, len(sessions) + 1))
    assert int(lines[-1][1]) == len(sessions) and lines[-1][4] == "no session left: the report follows"
    assert any(re.fullmatch(r"about [\d.]+ s left|about \d+ min \d+ s left", left) for *_, left in lines[:-1])
    events = [json.loads(x) for x in (run / "progress.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["start"] + ["session"] * len(sessions)
    report = (run / "report.md").read_text()
    assert re.search(r"^\*\*Wall time\*\*: measured \d+ s \(`progress.jsonl`, from the run's start to its last "
                     r"session's end; the jobs after that not counted\); predicted", report, re.M)


def test_report_and_configs(finished):
    workdir, _, _ = finished
    run = workdir / RUN
    report = (run / "report.md").read_text()
    assert "## Answer per op" in report and "| qkv | " in report and "| fc2 | " in report
    first_screen = report[:report.index("## How it was measured")]
    # the answer card leads: what a CPU run shows and cannot, the model TP, the files to load (none at TP 1)
    assert "**A CPU run.**" in first_screen and "**Model TP:" in first_screen and "**Confidence**" in first_screen
    meta = json.loads((run / "decisions.json").read_text())["meta"]
    if meta["model_tp"] == 1:
        assert "**Train without tensor parallelism (TP 1)**" in first_screen and "**Load**" not in first_screen
    else:
        assert "**Load**" in first_screen
    # a CPU run speaks of the CPU, and says its noise once
    assert "GPU time" not in report and "GPU·s" not in report
    if meta["measurement"].get("warning"):
        assert report.count(meta["measurement"]["warning"]) == 1
    # the torch backend measured no userbuffers: it writes its chunk map per TP, never a TE ub_cfgs yaml;
    # the plain names only hold the model TP's set (issue 33)
    files = meta["files"]
    assert not list(run.glob("tp_comm_overlap_cfg*.yaml")) and not list(run.glob("ub_cfgs*.json"))
    assert files["sets"]["2"]["files"] == {"chunked_cfg": "chunked_cfg.tp2.yaml"}
    cc = yaml.safe_load((run / "chunked_cfg.tp2.yaml").read_text())["customized_cc"]
    assert cc
    if files["sets"]["2"]["status"] == "proven":   # proven only where the map is what the block measured
        win = json.loads((run / "layer/tp2.json").read_text())["winner"]
        assert set(cc.values()) == {int(win.rsplit(".n", 1)[1]) if ".n" in win else 1}
    assert (run / "chunked_cfg.yaml").exists() == (files["default"] == "2") == (meta["model_tp"] == 2)
    decisions = json.loads((run / "decisions.json").read_text())
    assert set(decisions["ops"]) == {"qkv", "fc2"}
    for rec in decisions["ops"].values():
        assert rec["tp"] in (1, 2) and rec["evidence_cases"]
    import polars as pl
    meas = pl.read_parquet(run / "measurements.parquet")
    ok = meas.filter(pl.col("status") == "ok")
    assert ok.height >= 5 and ok["median_ms"].min() > 0
    assert (ok["fwd_comm_ms"].fill_null(0) >= 0).all()
    for case in ("qkv-tp2-none", "qkv-tp2-nocomm"):
        assert case in meas["case"].to_list()
    # every comparison is made inside one session: the point measured references and winners together
    point = json.loads((run / "sessions/qkv/tp2/point/session.json").read_text())
    assert {"qkv-tp2-none", "qkv-tp2-nocomm"} <= set(point["members"])
    assert point["rounds"] >= 2 and all(len(o) >= 1 for o in point["order"])
    assert point["order"][0] != point["order"][1]  # alternating rounds: the order rotates
    assert point["canary"]["case"] == "fc2-tp2-none" and point["canary"]["ms"] > 0
    # the TP point decides at the noise floor; a search step wins at decision.step_margin, ties at the floor
    assert point["margin"] == 0.02 and "tie_margin" not in point
    step = json.loads(next((run / "sessions").glob("*/tp2/*/step0/session.json")).read_text())
    assert (step["margin"], step["tie_margin"]) == (0.01, 0.02)
    for rec in decisions["ops"].values():
        assert rec["rounds"] >= 2 and rec["session"] == "qkv/tp2/point" or rec["op"] != "qkv"
    assert "drift canary" in report.lower() and "## Memory" in report and "## Sessions" in report
    # the layer stage: a whole block per TP, its settings side by side, the block-level choice recorded
    layer = json.loads((run / "layer/tp2.json").read_text())
    assert layer["winner"] and {r["variant"] for r in layer["settings"]} >= {"none", "nocomm"}
    # numerics against the fp64 block: every computed setting erred like fp32 no overlap, per tensor
    for r in layer["settings"]:
        if r["variant"] != "nocomm":
            assert r["correct"] is True and r["numerics"]["summary"]["input_grad"]["l2_ratio"] < 1.5, r
    assert "against the higher-precision block" in report
    assert decisions["meta"]["layer"]["2"]["tuned"] == layer["tuned"] and "## Layer at TP=2" in report


def test_run_cost_splits_what_the_members_held(finished):
    """benchmarks/run_cost.py on the real run: every part recorded and none negative (each rank's figures
    are taken at the slowest rank per figure, so a difference of two may dip by a rank's jitter)."""
    import sys
    from conftest import ROOT
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import run_cost
    workdir, _, _ = finished
    total = run_cost.run_cost(workdir / RUN)["ops"]["all"]
    assert total["member_rounds"] > 0 and total["window"] > 0 and total["hold"] == 0.0   # CPU: no hold
    parts = {n: total[n] for n, _ in run_cost.PARTS}
    assert all(x is not None and x > -0.01 * total["held_s"] for x in parts.values()), parts


def test_failed_case_is_reported_and_others_complete(finished):
    workdir, _, _ = finished
    run = json.loads((workdir / RUN / "sessions/fc2/tp2/chunks/step0/chunked.n4/run.json").read_text())
    assert run["status"] == "failed" and "injected failure on rank 1" in run["error"]["message"]
    partner = json.loads((workdir / RUN / "sessions/fc2/tp2/chunks/step0/chunked.n2/run.json").read_text())
    assert partner["status"] == "ok"  # the group restarted and the session went on
    report = (workdir / RUN / "report.md").read_text()
    assert "`fc2/tp2/chunks/step0` `fc2-tp2-chunked.n4`: **failed** — exception" in report
    failed = subprocess.run([sys.executable, "-m", "tptune", "failed", RUN], cwd=workdir,
                            capture_output=True, text=True).stdout
    assert failed.split() == [f"{RUN}/sessions/fc2/tp2/chunks/step0/session.json"]


def test_second_run_does_nothing(finished):
    workdir, _, _ = finished
    p = smk(workdir, "-n")
    assert "Nothing to be done" in p.stdout + p.stderr


def test_deleting_one_session_reruns_only_it(finished):
    workdir, _, _ = finished
    target = workdir / RUN / "search/qkv/tp2/point.json"
    saved = target.read_bytes()
    target.unlink()
    try:
        dry = smk(workdir, "-n")
        assert planned_sessions(dry.stdout + dry.stderr) == [("qkv", "2", "point")]
    finally:
        target.write_bytes(saved)


def test_changing_one_op_reruns_only_its_cases(finished):
    workdir, pool, _ = finished
    write_cfg(workdir, pool, op_settings={"fc2": {"timing": {"iters": 4}}})
    try:
        dry = smk(workdir, "-n")
        planned = planned_sessions(dry.stdout + dry.stderr)
        assert planned and {op for op, _, _ in planned} == {"fc2"}
    finally:
        write_cfg(workdir, pool)


@pytest.mark.parametrize("over,needle", [
    ({"ops": ["qkv", "attn"]}, "field 'ops.1': 'attn' is not one of"),
    ({"tp_sizes": [2, 16]}, "TP=16: num_attention_heads=8 is not divisible by 16"),
    ({"workload": {"seq_length": 0}}, "seq_length"),
    ({"timing": {"window_ms": "soon"}}, "field 'timing.window_ms': matches none of its forms"),
])
def test_bad_config_fails_before_any_job(tmp_path, workdir, pool_dir, over, needle):
    write_cfg(workdir, pool_dir, **over)
    p = smk(workdir, check=False)
    assert p.returncode != 0
    assert needle in p.stdout + p.stderr
    assert not (workdir / "outputs").exists()


def test_missing_model_field_named(tmp_path, workdir, pool_dir):
    (workdir / "config/models/broken.yaml").write_text("hidden_size: 512\nnum_attention_heads: 8\n"
                                                       "workload: {seq_length: 64}\n")
    write_cfg(workdir, pool_dir)
    cfg = yaml.safe_load((workdir / "run.yaml").read_text())
    cfg["model"] = "config/models/broken.yaml"
    (workdir / "run.yaml").write_text(yaml.safe_dump(cfg))
    p = smk(workdir, "-n", check=False)
    assert p.returncode != 0 and "missing field 'ffn_hidden_size'" in p.stdout + p.stderr


def test_lint_is_clean():
    from conftest import ROOT
    p = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr


def test_window_auto_calibrates_first_and_the_measuring_jobs_take_its_window(finished):
    """timing.window_ms: auto puts the calibrate_window rule before every measuring job, which then
    runs with the calibrated window (on CPU nothing is measured and the shortest candidate is written).
    Last in this file: it re-measures one session of the finished run."""
    workdir, pool, _ = finished
    write_cfg(workdir, pool, timing={"window_ms": "auto"})
    try:
        dry = smk(workdir, "-n")
        assert "calibrate_window" in dry.stdout and planned_sessions(dry.stdout)
        step = f"{RUN}/sessions/qkv/tp2/chunks/step0/session.json"
        p = subprocess.run([sys.executable, "-m", "snakemake", step, "--cores", "2", "--configfile", "run.yaml"],
                           cwd=workdir, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        rec = json.loads((workdir / RUN / "calibration/window.json").read_text())
        assert rec["window_ms"] == 500.0 and rec["why"].startswith("CPU: a round times timing.iters")
        assert "chosen: 500 ms" in (workdir / RUN / "logs/calibrate_window.log").read_text()
        sess = json.loads((workdir / step).read_text())
        run = json.loads((workdir / step).parent.joinpath(next(iter(sess["runs"].values()))).read_text())
        assert run["settings"]["timing"]["window_ms"] == 500.0
    finally:
        write_cfg(workdir, pool)
