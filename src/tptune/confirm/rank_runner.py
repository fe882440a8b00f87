"""One rank of the confirm stage's launch group: import the heavy libraries once, then run launch after launch,
each in a fresh child process forked from this one.

Why: a launch is a fresh training process (its own CUDA context, NCCL communicators, userbuffers, Megatron
globals), but about 20 s of each used to be imports (torch, Transformer Engine, which probes other frameworks,
Megatron). Forked after the imports and before any CUDA call, a child starts with them done and initialises
CUDA itself. Where the imports did initialise CUDA (``torch.cuda.is_initialized()``), a child could not use it,
so every launch then runs as a new interpreter instead (``spawn`` mode), as before.

The queue (a folder the stage writes): ``plan.jsonl``, one launch a line, read in order by every rank, so all
ranks run the same launch at the same time: {"id", "argv", "port", "timeout_s", "workdir"} or {"stop": true}.
Each child: its own session (killed whole), cwd and TMPDIR the launch's ``workdir``, its rank's output in
``<workdir>/rank<r>.log``, torch.distributed rendezvous on the launch's own port (``MASTER_PORT``; the agent's
store of torch.distributed.run is not reused: a second group on it would read the first's keys). The parent
writes ``done/<id>.rank<r>.json`` ({"rc", "timed_out", "wall_s", "mode"}) when its child ends, and kills its
child early when another rank's child of the same launch failed (its peers would wait in a collective until the
timeout).

Usage (one process per rank, as torch.distributed.run or a site's launcher starts them):
  python rank_runner.py QUEUE [--entry tptune | --entry PATH/pretrain_gpt.py]
``tptune``: confirm.trainer.main; a path: that script run as ``__main__`` (a user's Megatron-LM checkout, its
folder first on sys.path).
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback

IDLE_EXIT_S = 900.0       # no new launch for this long: the stage is gone


def _read_plan(path: str, start: int) -> list[dict]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines[start:]:
        if not line.endswith("}"):
            break                 # a line being written
        out.append(json.loads(line))
    return out


def _write_json(path: str, rec: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(rec, f)
    os.replace(tmp, path)


def _preimport(entry: str) -> None:
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")   # torch.cuda.is_available() without cuInit
    os.environ.setdefault("NVTE_FRAMEWORK", "pytorch")            # TE probes no other framework at import
    if entry == "tptune":
        import tptune.confirm.trainer  # noqa: F401
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(entry)))
        for name in ("megatron.training", "transformer_engine.pytorch"):
            try:                 # best effort: the script's own import says what is missing, in its log
                __import__(name)
            except ImportError as exc:
                print(f"rank_runner: {name} does not import before the script ({exc})", flush=True)


def _cuda_touched() -> bool:
    import torch
    return bool(torch.cuda.is_initialized())


def _die_with_parent() -> None:
    """The child has its own session (so it is killed whole); it must still not outlive its rank runner."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


_CURRENT: list[int] = []


def _on_term(signum, frame) -> None:
    for pid in _CURRENT:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os._exit(128 + signum)


def _child(launch: dict, entry: str, rank: int) -> None:
    """In the forked child: become the launch's training process; never returns."""
    code = 1
    try:
        os.setsid()
        _die_with_parent()
        wd = launch["workdir"]
        fd = os.open(os.path.join(wd, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW,
                     0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        os.chdir(wd)
        os.environ.update({"TMPDIR": wd, "MASTER_PORT": str(launch["port"]), "TORCHELASTIC_USE_AGENT_STORE": "False"})
        os.environ.update({k: str(v) for k, v in (launch.get("env") or {}).items()})
        import tempfile
        tempfile.tempdir = None
        if entry == "tptune":
            from tptune.confirm import trainer
            trainer.main(launch["argv"])
        else:
            import runpy
            sys.argv = [entry] + list(launch["argv"])
            runpy.run_path(entry, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _spawn_argv(launch: dict, entry: str) -> list[str]:
    if entry == "tptune":
        return [sys.executable, "-m", "tptune.confirm.trainer"] + list(launch["argv"])
    return [sys.executable, entry] + list(launch["argv"])


def _peer_failed(done_dir: str, lid: str, rank: int, world: int) -> bool:
    for r in range(world):
        if r == rank:
            continue
        p = os.path.join(done_dir, f"{lid}.rank{r}.json")
        if os.path.exists(p):
            try:
                with open(p) as f:
                    rec = json.load(f)
            except (OSError, ValueError):
                continue
            if rec.get("rc") != 0:
                return True
    return False


def _kill(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    return
            except ChildProcessError:
                return
            time.sleep(0.1)


def run_one(launch: dict, entry: str, rank: int, world: int, done_dir: str, mode: str) -> dict:
    t0 = time.monotonic()
    if mode == "fork":
        pid = os.fork()
        if pid == 0:
            _child(launch, entry, rank)
    else:
        import subprocess
        log = open(os.path.join(launch["workdir"], f"rank{rank}.log"), "wb")
        env = {**os.environ, "TMPDIR": launch["workdir"], "MASTER_PORT": str(launch["port"]),
               "TORCHELASTIC_USE_AGENT_STORE": "False", **{k: str(v) for k, v in (launch.get("env") or {}).items()}}
        pid = subprocess.Popen(_spawn_argv(launch, entry), cwd=launch["workdir"], env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True,
                               preexec_fn=_die_with_parent).pid
        log.close()
    _CURRENT[:] = [pid]
    timed_out, killed_for_peer, rc = False, False, None
    while True:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            rc = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - t0 > float(launch["timeout_s"]):
            timed_out = True
        elif _peer_failed(done_dir, launch["id"], rank, world):
            killed_for_peer = True
        if timed_out or killed_for_peer:
            _kill(pid)
            rc = -9
            break
        time.sleep(0.2)
    return {"rc": rc, "timed_out": timed_out, "killed_for_peer": killed_for_peer,
            "wall_s": round(time.monotonic() - t0, 2), "mode": mode}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    queue = argv[0]
    entry = argv[argv.index("--entry") + 1] if "--entry" in argv else "tptune"
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, _on_term)
    _preimport(entry)
    mode = "spawn" if (_cuda_touched() or os.environ.get("TPTUNE_CONFIRM_SPAWN") == "1") else "fork"
    done_dir = os.path.join(queue, "done")
    os.makedirs(done_dir, exist_ok=True)
    _write_json(os.path.join(queue, f"ready.rank{rank}.json"),
                {"mode": mode, "import_s": round(time.monotonic() - t0, 2), "pid": os.getpid()})
    seen, idle_since = 0, time.monotonic()
    plan = os.path.join(queue, "plan.jsonl")
    while True:
        new = _read_plan(plan, seen)
        if not new:
            if time.monotonic() - idle_since > IDLE_EXIT_S:
                return 3
            time.sleep(0.2)
            continue
        for launch in new:
            seen += 1
            if launch.get("stop"):
                return 0
            rec = run_one(launch, entry, rank, world, done_dir, mode)
            _write_json(os.path.join(done_dir, f"{launch['id']}.rank{rank}.json"), rec)
        idle_since = time.monotonic()


if __name__ == "__main__":
    sys.exit(main())
