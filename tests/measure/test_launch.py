"""The launcher for real: torch.distributed.run worker groups on gloo, warm reuse, and every failure path."""
import json
import os
import subprocess
import sys
import time

import pytest

from tptune.cases import parse_case_id
from tptune.measure.gpupool import GpuPool
from tptune.measure.launch import Launcher, classify_failure
from tptune.measure.preflight import resolve_here

from conftest import base_config

pytestmark = pytest.mark.slow


def _profile(pool_dir, tmp_path, case_id, fault=None, **launcher):
    cfg = base_config(pool_dir)
    cfg["launcher"].update(launcher)
    s = resolve_here(cfg)
    case = parse_case_id(case_id)
    op = dict(s.op(case.op).as_dict(), fault=fault)
    return Launcher(s).profile(case, s.model, tmp_path / case.dir, op), tmp_path / case.dir


def test_ok_case_then_warm_reuse(pool_dir, tmp_path):
    run, d = _profile(pool_dir, tmp_path, "proj-tp2-chunked.n2")
    assert run["status"] == "ok" and run["launch"]["server_started"]
    t = run["timing"]["total_ms"]
    assert t["n"] == 6 and t["min"] <= t["median"] <= t["max"] and len(t["samples"]) == 6
    assert sorted(run["traces"]) == ["trace.rank0.json.gz", "trace.rank1.json.gz"]
    assert all((d / f).stat().st_size > 0 for f in run["traces"])
    assert run["environment"]["env"]["UB_SKIPMC"] == "1" and run["environment"]["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert json.loads((d / "run.json").read_text())["case"] == "proj-tp2-chunked.n2"
    run2, _ = _profile(pool_dir, tmp_path, "proj-tp2-none")
    assert run2["status"] == "ok" and not run2["launch"]["server_started"]
    la = run2["launch"]   # where a request's time goes: the case, its teardown, the worker's handling
    assert 0 < la["case_s"] <= la["serve_s"] <= la["held_s"] and 0 <= la["close_s"] <= la["serve_s"]


def test_rank_raising_is_recorded_and_next_case_runs(pool_dir, tmp_path):
    run, d = _profile(pool_dir, tmp_path, "qkv-tp2-none", fault="raise:1")
    assert run["status"] == "failed"
    assert run["error"]["kind"] == "exception" and not run["error"]["transient"]
    assert "rank 1: RuntimeError: injected failure on rank 1" in run["error"]["message"]
    assert len(run["attempts"]) == 1  # deterministic: no retry
    assert json.loads((d / "run.json").read_text())["status"] == "failed"
    ok, _ = _profile(pool_dir, tmp_path, "qkv-tp2-nocomm")
    assert ok["status"] == "ok"


def test_hang_times_out_and_frees_the_slots(pool_dir, tmp_path):
    t0 = time.monotonic()
    run, _ = _profile(pool_dir, tmp_path, "fc2-tp2-none", fault="hang:0", case_timeout_s=8)
    assert run["status"] == "failed" and run["error"]["kind"] == "timeout"
    assert time.monotonic() - t0 < 60
    pool = GpuPool(pool_dir / os.environ.get("USER", str(os.getuid())) / "local" / "locks", [str(i) for i in range(8)])
    got = pool.try_acquire(8)
    assert got is not None  # every slot free again
    for fh in got[1]:
        fh.close()


def test_dying_rank_is_transient_and_retried(pool_dir, tmp_path):
    run, _ = _profile(pool_dir, tmp_path, "fc1-tp2-none", fault="exit:1", retries=1)
    assert run["status"] == "failed" and run["error"]["kind"] == "rank_died" and run["error"]["transient"]
    assert len(run["attempts"]) == 2


def test_failure_classes():
    assert classify_failure("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == ("oom", False)
    assert classify_failure("RuntimeError: initialize_ub failed: userbuffers bootstrap") == ("ub_init", False)
    assert classify_failure("NCCL error in: ... unhandled system error") == ("comm", True)
    assert classify_failure("ValueError: bad") == ("exception", False)


def test_gpu_pool_disjoint_and_freed_when_holder_dies(tmp_path):
    pool = GpuPool(tmp_path / "locks", ["0", "1", "2", "3"])
    a = pool.try_acquire(2)
    b = pool.try_acquire(2)
    assert a and b and not set(a[0]) & set(b[0]) and sorted(a[0] + b[0]) == ["0", "1", "2", "3"]
    assert pool.try_acquire(1) is None
    for fh in a[1] + b[1]:
        fh.close()
    # a process holding locks is killed: its GPUs are free again
    code = ("import sys,time; sys.path.insert(0, %r); from tptune.measure.gpupool import GpuPool; "
            "g = GpuPool(%r, ['0','1','2','3']).try_acquire(4); print('held', flush=True); time.sleep(60)"
            % (str(__import__('tptune').__path__[0].rsplit('/', 1)[0]), str(tmp_path / "locks")))
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    assert pool.try_acquire(1) is None
    p.kill()
    p.wait()
    c = pool.try_acquire(4)
    assert c is not None
    with pytest.raises(ValueError, match="needs 5 GPUs"):
        pool.try_acquire(5)
