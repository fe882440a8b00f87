"""One confirm launch: a fresh process group in its own temp folder and port, killed whole at its timeout;
its log kept, its iterations read, its failure (exit status, OOM, a userbuffers assert, a hang) recorded with
the first error lines. Nothing it leaves behind (temp files, a port, a stray rank) reaches the next launch."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tptune.confirm.megatron_log import as_dicts, error_lines, failure_kind, median_ms, parse_iterations

KILL_GRACE_S = 15.0


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LaunchResult:
    setting: str
    round: int
    position: int
    status: str                       # "ok" | "failed"
    wall_s: float
    returncode: int | None
    log: str                          # the log's path, relative to the run folder when inside it
    iterations: list[dict] = field(default_factory=list)
    median_ms: float | None = None
    failure: dict | None = None       # {"kind", "why", "lines"}

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("setting", "round", "position", "status", "wall_s", "returncode",
                                              "log", "median_ms", "failure", "iterations")}


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=KILL_GRACE_S)
            return
        except subprocess.TimeoutExpired:
            continue


def run_launch(argv_for, env_for, *, setting: str, round_: int, position: int, log_path: Path, timeout_s: float,
               iters: int, timed_from: int, rel_to: Path | None = None) -> LaunchResult:
    """Run one launch. ``argv_for(port)`` gives its command, ``env_for(tmp)`` its environment; it runs in a
    fresh temp folder (its cwd and TMPDIR, removed after) as the leader of its own process group, which is
    killed whole when ``timeout_s`` passes. ``iters``: the iterations a complete launch logs; ``timed_from``:
    the first iteration its median counts."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    timed_out = False
    with tempfile.TemporaryDirectory(prefix="tptune-confirm-") as tmp, open(log_path, "wb") as log:
        proc = subprocess.Popen(argv_for(free_port()), cwd=tmp, env=env_for(tmp), stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc)
            rc = proc.returncode
        else:
            _kill_group(proc)          # a rank its launcher left behind
    wall = round(time.monotonic() - t0, 2)
    text = log_path.read_text(errors="replace")
    its = parse_iterations(text)
    shown = str(log_path.relative_to(rel_to)) if rel_to and log_path.is_relative_to(rel_to) else str(log_path)
    res = LaunchResult(setting, round_, position, "ok", wall, rc, shown, as_dicts(its), median_ms(its, timed_from))
    why = None
    if timed_out:
        why = f"hung: killed at the {timeout_s:g} s timeout after {len(its)} of {iters} iterations"
    elif rc != 0:
        why = f"exit status {rc} after {len(its)} of {iters} iterations"
    elif not any(i.iteration >= iters for i in its):
        why = f"exit status 0 but {len(its)} of {iters} iterations logged"
    elif res.median_ms is None:
        why = f"no iteration from {timed_from} on logged"
    if why:
        kind = "timeout" if timed_out else (failure_kind(text) or ("exit" if rc != 0 else "incomplete"))
        res.status = "failed"
        res.failure = {"kind": kind, "why": why, "lines": error_lines(text)}
    return res
