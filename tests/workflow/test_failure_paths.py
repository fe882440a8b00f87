"""Failure paths end (issue 34, 1-6), on CPU for real (Snakemake, gloo workers, subprocesses): each ends
with its exit code and a message naming what failed, and loses nothing else that was measured."""
import json
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT, base_config, copy_workflow

pytestmark = pytest.mark.slow
TPTUNE = [sys.executable, "-m", "tptune"]


def _workflow(tmp_path, run, **over):
    copy_workflow(tmp_path)
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
    # the model-level rule judged nothing either (before: the summed no overlap against itself)
    assert "overlap rule at TP 2: no overlapped setting was measured: nothing to judge" in (run / "report.md").read_text()
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
    shutil.rmtree(tmp_path / "outputs/allfail-rd")
    # the README's recovery: the cause gone, -R on what tptune failed prints re-measures and the run ends
    cfg = yaml.safe_load((tmp_path / "run.yaml").read_text())
    cfg["faults"] = {}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    rec = smk(tmp_path, "-R", *failed.stdout.split(), timeout=400)
    assert rec.returncode == 0, (rec.stdout + rec.stderr)[-3000:]
    assert "failed" not in json.loads((run / "search/qkv/tp2/decision.json").read_text())
    assert "qkv-tp2-chunked.n2" in ok_runs(run / "sessions/qkv/tp2/point")
    # a decision.json whose "next" does not climb (edited, or from older code): a named error, no loop
    f = run / "search/qkv/tp2/decision.json"
    f.write_text(json.dumps({**json.loads(f.read_text()), "next": 2}))
    dry = smk(tmp_path, "-n", timeout=120)
    assert dry.returncode != 0
    assert "'next' is 2, not a TP above 2" in dry.stdout + dry.stderr, (dry.stdout + dry.stderr)[-2000:]


@pytest.fixture(scope="module")
def unreferenced(tmp_path_factory):
    """One run for 3 and 4: qkv's no-overlap reference fails at its TP point, and on the block no overlap
    and the bound fail while the tuned block is measured."""
    tmp_path = tmp_path_factory.mktemp("unreferenced")
    run = _workflow(tmp_path, "noref", faults={"qkv-tp2-none": "raise:0", "layer-tp2-none": "raise:0",
                                               "layer-tp2-nocomm": "raise:0"})
    return run, smk(tmp_path, timeout=400)


def test_a_failed_no_overlap_reference_still_writes_the_report(unreferenced):
    """3. Before: the report job raised in plot_summary (min() arg is an empty sequence) while
    decisions.json named an answer. Now the report is written, says at its top what was not compared,
    the per-op note says nothing was compared, and the run ends non-zero."""
    run, p = unreferenced
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


def test_a_block_verdict_that_compared_nothing_ends_the_run_non_zero(unreferenced):
    """4. Before: no overlap and the bound failed on the block, the tuned block was measured, and the run
    ended 0 with "no reference beats the tuned combination". Now the verdict says nothing was compared
    and the run ends non-zero, the tuned block's measurement kept."""
    run, p = unreferenced
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "layer stage at TP=2 failed: nothing was compared: layer-tp2-nocomm, layer-tp2-none failed" in out
    layer = json.loads((run / "layer/tp2.json").read_text())
    assert "no reference beats" not in layer["reason"] and layer["reason"].startswith("nothing was compared")
    report = (run / "report.md").read_text()
    assert "no reference beats" not in report
    assert "**Run failed — layer stage at TP=2: nothing was compared" in report.split("## Answer", 1)[0]
    assert ok_runs(run / "sessions/layer/tp2") == [layer["tuned"]]


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


def _profile(tmp_path, name, faults=None, **launcher):
    cfg = base_config(tmp_path / "pool", faults=faults or {}, launcher=launcher)
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    return [*TPTUNE, "profile", "--config", f"{name}.yaml", "--case", "qkv-tp2-none", "--out", f"{name}/run.json"]


def _group_in_flight(pool, timeout=120):
    """The registry entry of the worker group once it has had a case for a moment."""
    import time
    deadline = time.time() + timeout
    while time.time() < deadline:
        entries = list(pool.rglob("srv-*.json"))
        if entries and entries[0].with_suffix(".sock").exists():
            time.sleep(3)      # the request is sent at once; the injected hang follows the model's parse
            return json.loads(entries[0].read_text())
        time.sleep(0.2)
    raise AssertionError("no worker group started")


def _alive(pid):
    import os
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return open(f"/proc/{pid}/stat").read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["SIGTERM", "SIGINT", "SIGKILL"])
def test_an_interrupted_client_takes_its_worker_group_with_it(tmp_path, how):
    """2. Before: after SIGTERM (or Ctrl-C) of a measuring command the worker group went on computing the
    abandoned case with the pool lock released; the next case queued behind it, timed out after
    case_timeout_s, and was recorded as a non-transient hang. Now the group is gone when the client is
    (SIGTERM, SIGINT: before its locks are released; SIGKILL: the group sees its client's connection close)
    and the next case is measured."""
    import signal
    import time
    (tmp_path / "pool").mkdir()
    first = subprocess.Popen(_profile(tmp_path, "hang", {"qkv-tp2-none": "hang:0"}, case_timeout_s=300),
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        group = _group_in_flight(tmp_path / "pool")
        first.send_signal(getattr(signal, how))
        _, err = first.communicate(timeout=60)
    finally:
        first.kill()
    if how != "SIGKILL":
        assert first.returncode == 128 + getattr(signal, how), err[-2000:]
        assert "tptune profile: interrupted" in err and "Traceback" not in err, err[-2000:]
        assert not _alive(group["pid"]), "the worker group outlived its client"
    deadline = time.time() + 15
    while _alive(group["pid"]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(group["pid"]), "the worker group outlived its client"
    second = subprocess.run(_profile(tmp_path, "next", case_timeout_s=30), cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert second.returncode == 0, second.stderr[-2000:]
    run = json.loads((tmp_path / "next/run.json").read_text())
    assert run["status"] == "ok", run.get("error")
    assert all(a["status"] == "ok" for a in run["attempts"]), run["attempts"]


def test_sigterm_of_tptune_verify_takes_its_worker_group_with_it(tmp_path):
    """2. tptune verify (its own command line, no faults: a block long enough to be in flight) on SIGTERM
    ends with one line and exit 143, its worker group gone. Before: it died at once (-15) and the
    group went on computing the abandoned block."""
    import signal
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"launcher": {"pool_dir": str(tmp_path / "pool"),
                                                                     "idle_timeout_s": 5}}))
    (tmp_path / "cfg.yaml").write_text("qkv_fprop: {method: ring_exchange}\n")
    p = subprocess.Popen([*TPTUNE, "verify", "--model", str(ROOT / "config/models/tiny.yaml"), "--tp", "2",
                          "--cfg", "cfg.yaml", "--config", "pool.yaml", "--seq-length", "8192",
                          "--work-dir", "work"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        group = _group_in_flight(tmp_path / "pool")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 143 and "tptune verify: interrupted (SIGTERM)" in err and "Traceback" not in err, err
    assert not _alive(group["pid"]), "the worker group outlived tptune verify"


def test_a_session_stopped_by_sigint_resumes_from_its_completed_rounds(tmp_path):
    """A block session stopped by a timeout's SIGINT after some rounds (this session's Qwen3 MoE block on
    4x H200 was, twice, and kept nothing) keeps them in session.partial.json; the same command run again
    goes on from the next round instead of starting over, and ends as one session."""
    import signal
    import time
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"launcher": {"pool_dir": str(tmp_path / "pool"),
                                                                     "idle_timeout_s": 5},
                                                        "timing": {"min_rounds": 4, "max_rounds": 4}}))
    (tmp_path / "cfg.yaml").write_text("qkv_fprop: {method: ring_exchange}\n")
    cmd = [*TPTUNE, "verify", "--model", str(ROOT / "config/models/tiny.yaml"), "--tp", "2", "--cfg", "cfg.yaml",
           "--config", "pool.yaml", "--seq-length", "512", "--work-dir", "work"]
    sdir = tmp_path / "work" / "sessions" / "layer" / "tp2"
    p = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 300
        while not (sdir / "session.partial.json").exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert (sdir / "session.partial.json").exists(), "no round completed"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130 and "session.partial.json" in err and "Traceback" not in err, err[-2000:]
    done = len(json.loads((sdir / "session.partial.json").read_text())["order"])
    assert 1 <= done < 4 and not (sdir / "session.json").exists()
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    rec = json.loads((sdir / "session.json").read_text())
    assert rec["resumed_after_rounds"] == done and rec["rounds"] == 4
    assert not (sdir / "session.partial.json").exists()
    runs = {c: json.loads((sdir / path).read_text()) for c, path in rec["runs"].items()}
    assert all(r["timing"]["total_ms"]["round_ids"] == [0, 1, 2, 3] for r in runs.values()), \
        {c: r["timing"]["total_ms"]["round_ids"] for c, r in runs.items()}


ROGUE = """
import socket, sys, time
from tptune.cases import parse_case_id
from tptune.measure.launch import Launcher
from tptune.measure.worker.wire import send_json
from tptune.measure.preflight import resolve_here
from tptune.settings.resolve import load_run_config
cfg, source, base = load_run_config([sys.argv[1]])
s = resolve_here(cfg, source=source, base_dir=base, check_hardware=False)
case = parse_case_id("qkv-tp2-none")
ops = s.op("qkv").as_dict()
settings = Launcher(s)._settings_for(case, ops, {case.id: "hang:0"}, False, False)
conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
conn.connect(sys.argv[2])
send_json(conn, {"case": case.id, "out_dir": sys.argv[3], "model": s.model.to_dict(), "settings": settings})
print("sent", flush=True)
time.sleep(600)
"""


def test_a_case_never_waits_behind_a_group_computing_for_nobody(tmp_path):
    """2. A group computing a case for a client that holds no pool lock (an orphan's case: a killed
    client's, or a process that reached the socket on its own) is ended by the next client that holds
    those GPUs, which then measures. Before: the next case queued behind it and was recorded as a
    non-transient hang after case_timeout_s."""
    (tmp_path / "pool").mkdir()
    warm = subprocess.run(_profile(tmp_path, "warm", idle_timeout_s=120), cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr[-2000:]
    entry = next((tmp_path / "pool").rglob("srv-*.json"))
    group = json.loads(entry.read_text())
    rogue = subprocess.Popen([sys.executable, "-c", ROGUE, "warm.yaml", str(entry.with_suffix(".sock")),
                              str(tmp_path / "rogue")], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert rogue.stdout.readline().strip() == "sent"
        import time
        time.sleep(3)
        assert _alive(group["pid"])
        nxt = subprocess.run(_profile(tmp_path, "next", case_timeout_s=30), cwd=tmp_path, capture_output=True,
                             text=True, timeout=300)
    finally:
        rogue.kill()
        rogue.wait()
    assert nxt.returncode == 0, nxt.stderr[-2000:]
    run = json.loads((tmp_path / "next/run.json").read_text())
    assert run["status"] == "ok", run.get("error")
    assert all(a["status"] == "ok" for a in run["attempts"]), run["attempts"]
    assert run["attempts"][0]["ended_orphans"] == ["-".join(group["gpus"])]
    assert not _alive(group["pid"])


def test_ctrl_c_of_a_workflow_does_not_poison_the_next_run(tmp_path):
    """2. Ctrl-C (SIGINT to the workflow's process group, as a terminal sends it) while a TP point's case
    hangs: the worker group goes with the run, and the next run measures that session in full. Before:
    the group went on with the abandoned case, the next run's case queued behind it and was recorded as
    a hang after case_timeout_s."""
    import os
    import signal
    import time
    run = _workflow(tmp_path, "ctrlc", layer={"enabled": False}, faults={"qkv-tp2-chunked.n2": "hang:0"},
                    launcher={"case_timeout_s": 300})
    first = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "run.yaml"],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (run / "sessions/qkv/tp2/point/none/trace.rank0.json.gz").exists():
            time.sleep(0.5)          # the point's first member measured: the hanging one is next
        time.sleep(5)
        group = json.loads(next((tmp_path / "pool").rglob("srv-*.json")).read_text())
        os.killpg(first.pid, signal.SIGINT)
        first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode != 0
    deadline = time.time() + 15
    while _alive(group["pid"]) and time.time() < deadline:
        time.sleep(0.2)
    assert not _alive(group["pid"]), "the worker group outlived the run"
    cfg = yaml.safe_load((tmp_path / "run.yaml").read_text())
    cfg["faults"], cfg["launcher"]["case_timeout_s"] = {}, 30
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    p = smk(tmp_path, timeout=400)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    sess = run / "sessions/qkv/tp2/point"
    assert ok_runs(sess) == ["qkv-tp2-chunked.n2", "qkv-tp2-nocomm", "qkv-tp2-none"]
    for rj in sess.glob("*/run.json"):
        assert all(a["status"] == "ok" for a in json.loads(rj.read_text())["attempts"]), rj


def test_a_timeout_beside_another_group_on_its_cores_is_retried_not_a_hang(tmp_path):
    """2. Our case times out while another group computes on one of its cores (a one-core group of TP 2,
    fed by a process holding no pool lock, from the moment our case started): that attempt is "contended", transient, and retried (the other
    group ended first); only the retry, alone on its cores, is recorded as the hang. Before: the first
    timeout was a non-transient hang, never retried."""
    import time
    (tmp_path / "pool").mkdir()
    if not shutil.which("taskset"):
        pytest.skip("taskset is needed to start a group on one core")
    # a client allowed one core starts its TP 2 group on that core alone (pool ids: the cores it may use)
    one = subprocess.run(["taskset", "-c", "0", *_profile(tmp_path, "one", idle_timeout_s=120)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-2000:]
    other = next((tmp_path / "pool").rglob("srv-0.json"))
    ours = subprocess.Popen(_profile(tmp_path, "ours", {"qkv-tp2-none": "hang:0"}, case_timeout_s=10, retries=1), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    rogue = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not other.with_name("srv-0-1.sock").exists():
            time.sleep(0.1)
        rogue = subprocess.Popen([sys.executable, "-c", ROGUE, "one.yaml", str(other.with_suffix(".sock")),
                                  str(tmp_path / "rogue")], cwd=tmp_path, stdout=subprocess.PIPE, text=True)
        assert rogue.stdout.readline().strip() == "sent"
        ours.communicate(timeout=300)
    finally:
        ours.kill()
        if rogue:
            rogue.kill()
            rogue.wait()
    run = json.loads((tmp_path / "ours/run.json").read_text())
    kinds = [(a["error"]["kind"], a["error"]["transient"]) for a in run["attempts"]]
    assert kinds == [("contended", True), ("timeout", False)], run["attempts"]
    assert "srv" not in run["attempts"][0]["error"]["message"] and "0 computed on its GPUs" in \
        run["attempts"][0]["error"]["message"]


def test_a_rerun_after_a_kill_9_of_snakemake_gives_the_command_that_removes_its_lock(tmp_path):
    """7. (issue 54) Before: after a kill -9 of snakemake the plain rerun met Snakemake's lock, which the dead
    process could not remove, though docs/run-integrity.md says a killed run resumes with a plain snakemake.
    Now the rerun says the holder is gone and gives the command (records.run_lock.stale_snakemake_lock), and
    that command removes the lock."""
    import os
    import signal
    import time
    run = _workflow(tmp_path, "killed", layer={"enabled": False})
    first = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "run.yaml"],
                             cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    try:
        lock, deadline = run / ".run.lock", time.time() + 120
        while time.time() < deadline and not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            time.sleep(0.1)           # past Snakemake's lock and its onstart: the run is held
        assert lock.read_text().strip() == str(first.pid)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    p = smk(tmp_path, timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "LockException" in out, out[-3000:]
    assert (f"tptune: Snakemake's lock on outputs/killed was left by a snakemake that is gone (pid {first.pid}"
            in out), out[-3000:]
    command = out.split("the run resumes where it stopped): ", 1)[1].splitlines()[0]
    assert command == "snakemake --unlock --cores 2 --configfile run.yaml"
    unlocked = subprocess.run([sys.executable, "-m", *command.split()], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)
    assert unlocked.returncode == 0 and not (tmp_path / ".snakemake" / "locks").exists(), unlocked.stderr[-2000:]
