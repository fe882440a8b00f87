"""A job that waits for the shared worker pool says so (issue 47 item 10): one console line when the wait
starts, the wait's length in the session's record, and the report's wall-time line gives the total."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

from conftest import FIXTURES, ROOT

from tptune.measure.console import CONSOLE_ENV
from tptune.measure.gpupool import GpuPool


def test_a_wait_for_the_pool_says_one_line_and_is_timed(tmp_path, monkeypatch):
    """Another process holds the pool's only slot for about 1.5 s (a real flock on its lock file)."""
    locks = tmp_path / "locks"
    pool = GpuPool(locks, ["0"])
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from tptune.measure.gpupool import GpuPool
        with GpuPool({str(locks)!r}, ["0"]).acquire(1):
            print("held", flush=True)
            time.sleep(1.5)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    console = tmp_path / "console.txt"
    fd = os.open(console, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    monkeypatch.setenv(CONSOLE_ENV, str(fd))
    t0 = time.monotonic()
    try:
        with pool.acquire(1, what="CPU worker slots", waiting_for="session qkv/tp2/point", poll=0.05) as ids:
            waited = time.monotonic() - t0
    finally:
        os.close(fd)
        holder.wait(timeout=30)
    assert ids == ["0"] and waited > 1.0
    assert abs(pool.last_wait_s - waited) < 0.2
    lines = console.read_text().splitlines()
    assert lines == [f"tptune: session qkv/tp2/point waits for 1 CPU worker slots of the shared pool {locks} "
                     f"(held by pid {holder.pid}: another run, a test run or a leftover job); it starts when "
                     "they are free"]
    with pool.acquire(1):   # free now: no wait, no line
        pass
    assert pool.last_wait_s == 0.0 and len(console.read_text().splitlines()) == 1


def test_the_report_says_how_long_the_jobs_waited_for_the_pool(tmp_path):
    """The committed CPU run, two sessions' records edited to have waited 40 s and 25 s for the pool."""
    run = tmp_path / "run"
    shutil.copytree(FIXTURES / "cpu" / "tiny-default", run)
    for name, s in (("qkv/tp2/point", 40.0), ("layer/tp2", 25.0)):
        f = run / "sessions" / name / "session.json"
        rec = json.loads(f.read_text())
        rec["held"]["waited_for_pool_s"] = s
        f.write_text(json.dumps(rec))
    p = subprocess.run([sys.executable, "-m", "tptune", "rederive", str(run)], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in (run / "report.md").read_text().splitlines() if ln.startswith("**Wall time**"))
    assert "of which the measuring jobs waited 65 s for the shared worker pool (2 session(s); " in line, line
