"""The stage's side of a launch group: one process per rank (confirm.rank_runner, started by torch.distributed.run
or a site's launcher) that imports once and then runs the stage's launches one after another, each a fresh
training process. The stage hands it one launch at a time (a line of the queue's plan.jsonl), waits for every
rank's done marker, and reads the launch's logs and timing.

A group that dies (a rank crashed outside a launch, the launcher failed) fails the launch it was running; the
next launch starts a new group. A launch with no marker by its timeout plus a grace is failed as hung and its
group killed whole. Every launch of a group shares one compile cache (TorchInductor, Triton: Megatron-core's
fused kernels are torch.compile'd): the second launch on compiles nothing, and the kernels are the same.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tptune.confirm.launch import LaunchResult, free_port, launch_result
from tptune.confirm.megatron_log import error_lines

RUNNER = Path(__file__).resolve().parent / "rank_runner.py"
_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception)\b.*:")      # "ModuleNotFoundError: No module named ..."
GRACE_S = 60.0


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
            return
        except subprocess.TimeoutExpired:
            continue


class LaunchGroup:
    """``argv_for(port)``: the group's command (the runner's path and queue already in it); ``env``: its
    environment; ``nproc``: its ranks; ``startup_timeout_s``: how long the ranks may take to import."""

    def __init__(self, argv_for, env: dict, nproc: int, *, startup_timeout_s: float = 300.0, say=print):
        self.nproc, self.say = nproc, say
        self.tmp = Path(tempfile.mkdtemp(prefix="tptune-confirm-group-"))
        self.queue = self.tmp / "queue"
        (self.queue / "done").mkdir(parents=True)
        cache = self.tmp / "compile-cache"
        env = {**env, "TMPDIR": str(self.tmp), "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
               "TRITON_CACHE_DIR": str(cache / "triton")}
        self.log_path = self.tmp / "group.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv_for(free_port(), str(self.queue)), cwd=self.tmp, env=env,
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.t0 = time.monotonic()
        self.startup_timeout_s = startup_timeout_s
        self.started = False
        self.start_failure: str | None = None     # the ranks died before they were ready (an import failed)
        self.n = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _markers(self, lid: str) -> dict[int, dict]:
        out = {}
        for r in range(self.nproc):
            p = self.queue / "done" / f"{lid}.rank{r}.json"
            if p.is_file():
                try:
                    out[r] = json.loads(p.read_text())
                except ValueError:
                    pass             # being written
        return out

    def ready(self) -> bool:
        """Whether every rank finished its imports (its ready marker)."""
        return all((self.queue / f"ready.rank{r}.json").is_file() for r in range(self.nproc))

    def import_s(self) -> float | None:
        p = self.queue / "ready.rank0.json"
        return json.loads(p.read_text()).get("import_s") if p.is_file() else None

    def mode(self) -> str | None:
        p = self.queue / "ready.rank0.json"
        return json.loads(p.read_text()).get("mode") if p.is_file() else None

    def run(self, *, setting: str, round_: int, position: int, argv: list[str], env: dict | None, timeout_s: float,
            log_path: Path, rel_to: Path | None, iters: int, timed_from: int, timing_name: str | None) -> LaunchResult:
        """Run one launch; its record (failed when the group died or the launch hung)."""
        self.n += 1
        lid = f"{self.n:03d}-r{round_}-{setting}"
        wd = self.tmp / lid
        wd.mkdir()
        argv = [a.replace("{workdir}", str(wd)) for a in argv]
        line = {"id": lid, "argv": argv, "port": free_port(), "timeout_s": timeout_s, "workdir": str(wd),
                "env": env or {}}
        with open(self.queue / "plan.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")
        t0 = time.monotonic()
        limit = timeout_s + GRACE_S + (0 if self.started else self.startup_timeout_s)
        why = None
        while True:
            marks = self._markers(lid)
            if len(marks) == self.nproc:
                break
            if not self.alive():
                time.sleep(0.5)
                marks = self._markers(lid)
                if len(marks) == self.nproc:
                    break
                if not self.ready():
                    self._log.flush()
                    text = self.log_path.read_text(errors="replace")
                    lines = [x for x in error_lines(text, limit=40)
                             if _EXCEPTION.match(x) and "ChildFailedError" not in x][:2] or \
                        [x for x in text.splitlines() if x.strip()][-3:]
                    self.start_failure = (f"the launch group's ranks exited (status {self.proc.returncode}) before "
                                          "they were ready: " + " | ".join(lines))
                    why = self.start_failure
                    break
                why = f"the launch group exited (status {self.proc.returncode}) during the launch"
                break
            if time.monotonic() - t0 > limit:
                why = f"no end reported by every rank within {limit:g} s: the launch group was killed"
                _kill_group(self.proc)
                break
            time.sleep(0.2)
        self.started = True
        rc = next((m["rc"] for m in marks.values() if m.get("rc") != 0), 0) if marks else None
        timed_out = any(m.get("timed_out") for m in marks.values())
        wall = max((m["wall_s"] for m in marks.values()), default=time.monotonic() - t0)
        text = self._merge_logs(wd, log_path, why)
        timing = None
        if timing_name and (wd / timing_name).is_file():
            try:
                timing = json.loads((wd / timing_name).read_text())
            except ValueError:
                timing = None
        shown = str(log_path.relative_to(rel_to)) if rel_to and log_path.is_relative_to(rel_to) else str(log_path)
        res = launch_result(text, setting=setting, round_=round_, position=position, rc=rc, timed_out=timed_out,
                            timeout_s=timeout_s, wall_s=wall, log=shown, iters=iters, timed_from=timed_from,
                            timing=timing, why_failed=why)
        shutil.rmtree(wd, ignore_errors=True)
        return res

    def _merge_logs(self, wd: Path, log_path: Path, why: str | None) -> str:
        """Every rank's output in one log, rank 0 first (the training-log line comes from the last rank)."""
        parts = []
        for r in range(self.nproc):
            p = wd / f"rank{r}.log"
            if p.is_file():
                parts.append(f"===== rank {r} =====\n" + p.read_text(errors="replace"))
        if why:
            self._log.flush()
            parts.append("===== launch group =====\n" + why + "\n" + self.log_path.read_text(errors="replace")[-20000:])
        text = "\n".join(parts)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = log_path.with_name(log_path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, log_path)
        return text

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None and not kill:
            with open(self.queue / "plan.jsonl", "a") as f:
                f.write(json.dumps({"stop": True}) + "\n")
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        _kill_group(self.proc)
        self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
