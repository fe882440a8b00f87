"""The confirm stage's launch group with real subprocesses (confirm.group over confirm.rank_runner, ranks started by
torch.distributed.run on CPU): each launch a process forked from a rank runner that imported once, with its own
folder, port and log; a launch that exits non-zero, hangs (killed whole at its timeout, the group going on), prints
an OOM line, or stops short is recorded with its reason; a rank that fails stops its peers at once."""
import json
import os
import sys
from pathlib import Path

from tptune.confirm.command import LAUNCH_ENV, launch_env, launcher_argv
from tptune.confirm.group import LaunchGroup

PY = sys.executable


def _group(tmp_path, nproc=2):
    script = tmp_path / "launch.py"
    # each launch's argv is one line of Python the stand-in script runs (the rank runner's path entry)
    script.write_text("import sys\nexec(sys.argv[1])\n")
    env = launch_env(dict(os.environ))
    return LaunchGroup(lambda port, q: launcher_argv(nproc, port) + [q, "--entry", str(script)], env, nproc,
                       startup_timeout_s=120)


def _run(g, tmp_path, code, timeout_s=30.0, name="x"):
    return g.run(setting=name, round_=0, position=0, argv=[code], env=None, timeout_s=timeout_s,
                 log_path=tmp_path / f"{name}.log", rel_to=None, iters=30, timed_from=10, timing_name=None)


def test_launches_run_in_turn_and_failures_are_recorded_while_the_group_goes_on(tmp_path):
    g = _group(tmp_path)
    try:
        r = _run(g, tmp_path, "import sys; print('RuntimeError: boom', file=sys.stderr); sys.exit(3)", name="exit")
        assert r.status == "failed" and r.returncode == 3 and r.failure["kind"] == "exit"
        assert r.failure["why"] == "exit status 3 after 0 of 30 iterations"
        assert "RuntimeError: boom" in r.failure["lines"]
        r = _run(g, tmp_path, "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB')",
                 name="oom")
        assert r.status == "failed" and r.failure["kind"] == "oom" and r.returncode == 0
        r = _run(g, tmp_path, "import time; time.sleep(60)", timeout_s=3, name="hang")
        assert r.status == "failed" and r.failure["kind"] == "timeout" and r.wall_s < 30
        assert r.failure["why"].startswith("hung: killed at the 3 s timeout")
        # one rank fails at once, its peer would wait in a collective: it is stopped, not left to its timeout
        r = _run(g, tmp_path, "import os, sys, time\nif os.environ['RANK'] == '0': sys.exit(5)\ntime.sleep(60)",
                 timeout_s=120, name="peer")
        assert r.status == "failed" and r.returncode == 5 and r.wall_s < 60
        # the group is alive after all of it, each launch saw its own folder, port and the required variables
        r = _run(g, tmp_path, "import os, json; print(json.dumps({k: os.environ.get(k) for k in "
                 f"{sorted(LAUNCH_ENV)} + ['TMPDIR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE']}}), os.getcwd())", name="env")
        assert g.alive() and g.mode() == "fork"
        lines = [x for x in Path(tmp_path / "env.log").read_text().splitlines() if x.startswith("{")]
        seen = [json.loads(x.split("} ")[0] + "}") for x in lines]
        assert sorted(s["RANK"] for s in seen) == ["0", "1"] and all(s["WORLD_SIZE"] == "2" for s in seen)
        assert all(s[k] == v for s in seen for k, v in LAUNCH_ENV.items())
        assert len({s["TMPDIR"] for s in seen}) == 1 and "tptune-confirm-group-" in seen[0]["TMPDIR"]
        assert r.status == "failed" and r.failure["why"] == "exit status 0 but 0 of 30 iterations logged"
    finally:
        g.close()
    assert not g.tmp.exists()
