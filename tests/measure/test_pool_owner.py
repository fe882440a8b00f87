"""A wait for the shared pool names who holds it (issue 54 item 9): a slot held by the run's own measuring
job is the run's own queue, not "another run, a test run or a leftover job", on the console and in the
report's wall-time line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

from conftest import FIXTURES, ROOT

from tptune.measure.console import CONSOLE_ENV
from tptune.measure.gpupool import GpuPool


def _holder(locks, owner):
    """Another process of run ``owner`` that holds the pool's only slot for about a second (a real flock)."""
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from tptune.measure.gpupool import GpuPool
        with GpuPool({str(locks)!r}, ["0"]).acquire(1, owner={owner!r}):
            print("held", flush=True)
            time.sleep(1.0)
    """)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def _wait(tmp_path, monkeypatch, holder_owner, owner):
    locks = tmp_path / "locks"
    pool = GpuPool(locks, ["0"])
    holder = _holder(locks, holder_owner)
    console = tmp_path / "console.txt"
    fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    monkeypatch.setenv(CONSOLE_ENV, str(fd))
    try:
        with pool.acquire(1, what="CPU worker slots", waiting_for="session qkv/tp2/point", poll=0.05, owner=owner):
            pass
    finally:
        os.close(fd)
        holder.wait(timeout=30)
    return pool, holder.pid, console.read_text().splitlines()


def test_a_slot_held_by_the_runs_own_job_is_its_own_queue(tmp_path, monkeypatch):
    run = str(tmp_path / "outputs" / "tiny")
    pool, pid, lines = _wait(tmp_path, monkeypatch, run, run)
    assert pool.last_wait_s > 0.5 and pool.last_wait_by == "own"
    assert len(lines) == 1 and "another run" not in lines[0], lines
    assert f"held by pid {pid}: this run's own measuring job(s)" in lines[0], lines


def test_a_slot_held_by_another_run_is_named_so(tmp_path, monkeypatch):
    pool, pid, lines = _wait(tmp_path, monkeypatch, str(tmp_path / "outputs" / "other"),
                             str(tmp_path / "outputs" / "tiny"))
    assert pool.last_wait_by == "other"
    assert f"(held by pid {pid}: another run, a test run or a leftover job)" in lines[0], lines


def test_the_wall_time_line_tells_own_waits_from_others(tmp_path):
    """The committed CPU run, two sessions' records edited: one waited 40 s behind the run's own jobs, one 25 s
    behind another run's. Before: all 65 s were 'another run, a test run or a leftover job'."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "cpu" / "tiny-default", run)
    for name, s, by in (("qkv/tp2/point", 40.0, "own"), ("layer/tp2", 25.0, "other")):
        f = run / "sessions" / name / "session.json"
        rec = json.loads(f.read_text())
        rec["held"].update(waited_for_pool_s=s, pool_held_by=by)
        f.write_text(json.dumps(rec))
    p = subprocess.run([sys.executable, "-m", "tptune", "rederive", str(run)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in (run / "report.md").read_text().splitlines() if ln.startswith("**Wall time**"))
    assert "waited 40 s for the run's own measuring jobs (1 session(s)" in line, line
    assert "waited 25 s for the shared worker pool (1 session(s); `launcher.pool_dir`: another run" in line, line
    # the CPU run's prediction (laid on 8) is on worker slots, not GPUs (issue 54 item 9: "on 8 GPUs")
    assert "predicted 156 s on 8 GPUs" not in line and "predicted 156 s on 8 worker slots" in line, line
