"""One confirm launch's failure paths with real subprocesses: a command that exits non-zero, one that hangs and is
killed with its whole process group at the timeout, one that prints an OOM line; and torch.distributed.run
launching ranks with the environment and port the stage gives them."""
import json
import os
import sys
import time
from pathlib import Path

from tptune.confirm.command import LAUNCH_ENV, launch_env, launcher_argv
from tptune.confirm.launch import run_launch

PY = sys.executable


def _run(tmp_path, code, timeout_s=20.0, name="x"):
    return run_launch(lambda port: [PY, "-c", code], lambda tmp: launch_env(dict(os.environ), tmp), setting=name,
                      round_=0, position=0, log_path=tmp_path / f"{name}.log", timeout_s=timeout_s, iters=30,
                      timed_from=10)


def test_a_non_zero_exit_is_recorded_with_its_error_lines(tmp_path):
    r = _run(tmp_path, "import sys; print('hello'); print('RuntimeError: boom', file=sys.stderr); sys.exit(3)")
    assert r.status == "failed" and r.returncode == 3
    assert r.failure["kind"] == "exit" and r.failure["why"] == "exit status 3 after 0 of 30 iterations"
    assert r.failure["lines"] == ["RuntimeError: boom"]


def test_a_hang_is_killed_with_its_process_group_at_the_timeout(tmp_path):
    # the launcher starts a child that would outlive it; both must be gone when the launch returns
    code = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            "print(c.pid, flush=True); time.sleep(600)")
    t0 = time.monotonic()
    r = _run(tmp_path, code, timeout_s=2.0)
    assert time.monotonic() - t0 < 20
    assert r.status == "failed" and r.failure["kind"] == "timeout"
    assert r.failure["why"].startswith("hung: killed at the 2 s timeout")
    child = int((tmp_path / "x.log").read_text().split()[0])
    time.sleep(0.2)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]


def test_an_oom_line_names_the_failure(tmp_path):
    r = _run(tmp_path, "import sys; print('[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                       "2.00 GiB'); sys.exit(1)")
    assert r.failure["kind"] == "oom" and "CUDA out of memory" in r.failure["lines"][0]


def test_exit_zero_without_every_iteration_is_a_failure(tmp_path):
    r = _run(tmp_path, "print(' iteration        1/      30 | elapsed time per iteration (ms): 5.0 | lm loss: "
                       "1.0E+01 |')")
    assert r.status == "failed" and r.failure["kind"] == "incomplete" and len(r.iterations) == 1


def test_each_launch_gets_its_own_temp_folder_and_the_required_environment(tmp_path):
    code = ("import json, os, tempfile; open(os.path.join(os.getcwd(), 'left-behind'), 'w').write('x'); "
            "print(json.dumps({'cwd': os.getcwd(), 'tmp': tempfile.gettempdir(), "
            "'env': {k: os.environ.get(k) for k in %r}}))" % (list(LAUNCH_ENV) + ["NVTE_FWD_LAYERNORM_SM_MARGIN"]))
    os.environ["NVTE_FWD_LAYERNORM_SM_MARGIN"] = "20"
    try:
        a, b = _run(tmp_path, code, name="a"), _run(tmp_path, code, name="b")
    finally:
        del os.environ["NVTE_FWD_LAYERNORM_SM_MARGIN"]
    seen = [json.loads((tmp_path / f"{n}.log").read_text()) for n in "ab"]
    assert seen[0]["cwd"] != seen[1]["cwd"] and all(s["cwd"] == s["tmp"] for s in seen)
    assert not Path(seen[0]["cwd"]).exists()                     # removed with what the launch left in it
    assert all(s["env"] == {**LAUNCH_ENV, "NVTE_FWD_LAYERNORM_SM_MARGIN": None} for s in seen)


def test_torchrun_starts_nproc_ranks_on_the_given_port(tmp_path):
    entry = tmp_path / "rank.py"
    entry.write_text("import os\nprint('rank', os.environ['RANK'], os.environ['WORLD_SIZE'], "
                     "os.environ['MASTER_PORT'], os.environ['UB_SKIPMC'], flush=True)\n")
    ports = []
    r = run_launch(lambda port: ports.append(port) or launcher_argv(2, port, entry),
                   lambda tmp: launch_env(dict(os.environ), tmp), setting="t", round_=0, position=0,
                   log_path=tmp_path / "t.log", timeout_s=60, iters=1, timed_from=1)
    lines = sorted(x for x in (tmp_path / "t.log").read_text().splitlines() if x.startswith("rank"))
    assert r.returncode == 0
    assert lines == [f"rank {k} 2 {ports[0]} 1" for k in (0, 1)]
