"""Failure paths end (issue 34, 1-6), on CPU for real (Snakemake, gloo workers, subprocesses): each ends
with its exit code and a message naming what failed, and loses nothing else that was measured."""
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config

pytestmark = pytest.mark.slow
TPTUNE = [sys.executable, "-m", "tptune"]


def _workflow(tmp_path, run, **over):
    for name in ("Snakefile", "rules", "config", "profiles", "envs"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "pool").mkdir()
    cfg = base_config(tmp_path / "pool", **{"run": run, "ops": ["qkv"], "tp_sizes": [2],
                                            "search": {"chunks": [2]}, **over})
    cfg["model"] = "config/models/tiny.yaml"
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    return tmp_path / "outputs" / run


def smk(workdir, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "run.yaml", *args],
                          cwd=workdir, capture_output=True, text=True, timeout=timeout)


def ok_runs(session_dir):
    return sorted(json.loads(p.read_text())["case"] for p in session_dir.glob("*/run.json")
                  if json.loads(p.read_text())["status"] == "ok")


def test_every_overlapped_setting_failing_stops_the_tp_chain(tmp_path):
    """1. Before: search/qkv/tp2/decision.json got "next": 2 and Snakemake's DAG update walked the TP
    chain forever (this test's time-out). Now the chain stops at TP 2 with a named failure, the run ends
    non-zero, the report says which op and why, a dry run and tptune rederive end, and the references
    measured in the same session are kept."""
    run = _workflow(tmp_path, "allfail", tp_sizes=[2, 4], search={"chunks": [2, 4]}, layer={"enabled": False},
                    faults={"qkv-tp2-chunked.n2": "raise:0", "qkv-tp2-chunked.n4": "raise:0"})
    p = smk(tmp_path, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert re.search(r"qkv TP=2 TP point failed: none of its \d overlapped settings was measured", out), out[-3000:]
    dec = json.loads((run / "search/qkv/tp2/decision.json").read_text())
    assert dec["next"] is None and dec["chosen_tp"] == 1 and "qkv TP=2 TP point" in dec["failed"]
    assert not (run / "search/qkv/tp4").exists()
    head = (run / "report.md").read_text().split("## Answer", 1)[0]
    assert "**Run failed — qkv TP=2 TP point: none of its" in head and "overlapped settings was measured" in head
    decisions = json.loads((run / "decisions.json").read_text())
    assert "nothing was compared at TP=2" in decisions["ops"]["qkv"]["config"]["note"]
    assert ok_runs(run / "sessions/qkv/tp2/point") == ["qkv-tp2-nocomm", "qkv-tp2-none"]
    failed = subprocess.run([*TPTUNE, "failed", "outputs/allfail"], cwd=tmp_path, capture_output=True, text=True)
    assert "outputs/allfail/sessions/qkv/tp2/point/session.json" in failed.stdout.split()
    dry = smk(tmp_path, "-n", timeout=120)
    assert dry.returncode == 0, dry.stderr[-2000:]
    # 6. tptune rederive after a failed TP point: before, a traceback ("TP decision not finished")
    shutil.copytree(run, tmp_path / "outputs/allfail-rd")
    rd = subprocess.run([*TPTUNE, "rederive", "outputs/allfail-rd"], cwd=tmp_path, capture_output=True, text=True,
                        timeout=300)
    assert rd.returncode == 0 and "Traceback" not in rd.stderr, rd.stderr[-3000:]
    assert (tmp_path / "outputs/allfail-rd/search/qkv/tp2/decision.json").read_text() == \
        (run / "search/qkv/tp2/decision.json").read_text()


def test_a_chain_that_does_not_climb_is_refused(tmp_path):
    """1. A decision.json whose "next" does not increase (edited, or from older code) ends the walk with
    a named error instead of looping in the DAG update."""
    run = _workflow(tmp_path, "climb", layer={"enabled": False})
    p = smk(tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    f = run / "search/qkv/tp2/decision.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "next": 2}))
    dry = smk(tmp_path, "-n", timeout=120)
    assert dry.returncode != 0
    assert "'next' is 2, not a TP above 2" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-2000:]


def test_a_failed_no_overlap_reference_still_writes_the_report(tmp_path):
    """3. Before: the report job raised in plot_summary (min() arg is an empty sequence) while
    decisions.json named an answer. Now the report is written, says at its top what was not compared,
    the per-op note says nothing was compared, and the run ends non-zero."""
    run = _workflow(tmp_path, "noref", layer={"enabled": False}, faults={"qkv-tp2-none": "raise:0"})
    p = smk(tmp_path, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "qkv TP=2 TP point failed: nothing was compared against qkv-tp2-none, which failed" in out
    report = (run / "report.md").read_text()
    assert "Traceback" not in (run / "logs/report.log").read_text()
    head = report.split("## Answer", 1)[0]
    assert "**Run failed — qkv TP=2 TP point: nothing was compared against qkv-tp2-none, which failed**" in head
    note = json.loads((run / "decisions.json").read_text())["ops"]["qkv"]["config"]["note"]
    assert note.startswith("nothing was compared at TP=2") and "hid" not in note
    assert ok_runs(run / "sessions/qkv/tp2/point") == ["qkv-tp2-chunked.n2", "qkv-tp2-nocomm"]
    assert not (run / "status.json").exists()


def test_a_block_verdict_that_compared_nothing_ends_the_run_non_zero(tmp_path):
    """4. Before: no overlap and the bound failed on the block, the tuned block was measured, and the run
    ended 0 with "no reference beats the tuned combination". Now the verdict says nothing was compared
    and the run ends non-zero, the tuned block's measurement kept."""
    run = _workflow(tmp_path, "noblock", faults={"layer-tp2-none": "raise:0", "layer-tp2-nocomm": "raise:0"})
    p = smk(tmp_path, timeout=400)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "layer stage at TP=2 failed: nothing was compared: layer-tp2-nocomm, layer-tp2-none failed" in out
    layer = json.loads((run / "layer/tp2.json").read_text())
    assert "no reference beats" not in layer["reason"] and layer["reason"].startswith("nothing was compared")
    report = (run / "report.md").read_text()
    assert "no reference beats" not in report
    assert "**Run failed — layer stage at TP=2: nothing was compared" in report.split("## Answer", 1)[0]
    assert ok_runs(run / "sessions/layer/tp2") == [layer["tuned"]]
    assert ok_runs(run / "sessions/qkv/tp2/point") == ["qkv-tp2-chunked.n2", "qkv-tp2-nocomm", "qkv-tp2-none"]


@pytest.mark.parametrize("name", ["..", ".", ".hidden"])
def test_a_run_name_stays_inside_outputs(tmp_path, name):
    """5. Before: run: ".." wrote the run into the checkout root ("." into outputs/ itself). Now validate
    and the workflow refuse it, naming the field, and write nothing."""
    _workflow(tmp_path, name, layer={"enabled": False})
    v = subprocess.run([*TPTUNE, "validate", "run.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert v.returncode == 2 and "Traceback" not in v.stderr
    assert f"field 'run' = {name!r}: expected a folder name inside outputs/" in v.stderr, v.stderr
    p = smk(tmp_path, timeout=120)
    assert p.returncode != 0 and f"field 'run' = {name!r}" in p.stdout + p.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("model,needle", [
    (None, "field 'model': None is not of type 'string'"),
    (["a.yaml", "b.yaml"], "field 'model': ['a.yaml', 'b.yaml'] is not of type 'string'"),
    ("latin1.yaml", "latin1.yaml: not UTF-8 text (byte 0xe9 at offset"),
])
def test_a_bad_model_field_or_file_is_one_line(tmp_path, model, needle):
    """6. Before: tracebacks (TypeError on Path / None, UnicodeDecodeError)."""
    (tmp_path / "latin1.yaml").write_bytes((ROOT / "config/models/tiny.yaml").read_bytes() + b"# caf\xe9\n")
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"model": model}))
    v = subprocess.run([*TPTUNE, "validate", "run.yaml"], cwd=tmp_path, capture_output=True, text=True)
    assert v.returncode == 2 and "Traceback" not in v.stderr, v.stderr[-2000:]
    assert needle in v.stderr, v.stderr


def _mount_tmpfs(where, *opts):
    where.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(opts), "tmpfs", str(where)], capture_output=True)
    if p.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.decode()[:200]}")


def test_an_unwritable_outputs_folder_at_start_is_one_line(tmp_path):
    """6. Before: the onstart handler's OSError traceback. Now one line naming the folder, nothing run."""
    _workflow(tmp_path, "ro", layer={"enabled": False})
    _mount_tmpfs(tmp_path / "outputs", "ro", "size=64k")
    try:
        p = smk(tmp_path, timeout=120)
    finally:
        subprocess.run(["umount", str(tmp_path / "outputs")])
    out = p.stdout + p.stderr
    assert p.returncode == 1
    assert "outputs/ro: cannot write the run's folder (Read-only file system): nothing measured" in out, out[-2000:]
    assert "Traceback" not in out and "OSError" not in out


def test_a_full_disk_says_so_on_the_console(tmp_path):
    """6. Before: the job that hit the full disk ended with "message: None" and an empty log, nothing
    saying why. Now the console has one line naming the file and the full disk; what was written before
    is kept whole (atomic writes)."""
    run = _workflow(tmp_path, "full", layer={"enabled": False})
    _mount_tmpfs(tmp_path / "outputs", "size=120k")
    try:
        p = smk(tmp_path, timeout=400)
        out = p.stdout + p.stderr
        assert p.returncode == 1
        assert re.search(r"tptune [a-z-]+: \S+: No space left on device \(the disk is full: free space and run "
                         r"again; what was written before is kept\)", out), out[-3000:]
        assert "Traceback" not in out
        for f in run.rglob("*.json"):     # every record there whole
            json.loads(f.read_text())
    finally:
        subprocess.run(["umount", str(tmp_path / "outputs")])
