"""Client side of profiling: take GPUs, reach a warm worker group (or start one), run a case, write run.json.

Whatever happens to the case (a rank raising, OOM, UB init failure, a hang, a dying rank), a run.json
with status "failed" and the reason is written, the GPUs are released, and the caller goes on.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tptune import __version__
from tptune.cases import Case
from tptune.measure.envinfo import launch_env
from tptune.measure.gpupool import GpuPool, count_gpus, cpu_slot_ids, pool_folder, visible_ids
from tptune.measure.session_spec import SessionSpec
from tptune.model.spec import ModelConfig
from tptune.settings.resolve import Settings
from tptune.records.files import take_lock, write_text_atomic
from tptune.records.measured_point import METRIC, MeasuredPoint
from tptune.records.run_dir import PARTIAL_JSON, RUN_JSON, SESSION_JSON
from tptune.stats.host_evidence import evidence as host_evidence
from tptune.stats.rounds import SessionState, measured_next, rotation, session_state, should_stop
from tptune.stats.spread import slowest_rank, stats
from tptune.measure.worker.gpu_clock import clock_over_rounds, merge_ranks
from tptune.measure.worker.lifeline import is_busy
from tptune.measure.worker.wire import recv_json, send_json

_FAILURE_RULES = [  # (substring, kind, transient) - first match wins
    ("out of memory", "oom", False),
    ("OutOfMemoryError", "oom", False),
    ("userbuffers", "ub_init", False),
    ("initialize_ub", "ub_init", False),
    ("ub_cfgs", "ub_init", False),
    ("NCCL error", "comm", True),
    ("Connection reset", "comm", True),
    ("Connection closed by peer", "comm", True),
]


_PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "remote worker crashing")


def _peer_lost(message: str) -> bool:
    return any(n in message for n in _PEER_LOST)


def classify_failure(text: str) -> tuple[str, bool]:
    for needle, kind, transient in _FAILURE_RULES:
        if needle.lower() in text.lower():
            return kind, transient
    return "exception", False


def _code_signature(extra: dict) -> str:
    """Workers are reused only by clients running the same code with the same launch settings."""
    h = hashlib.sha256(json.dumps(extra, sort_keys=True).encode() + __version__.encode())
    for f in sorted(Path(__file__).parents[1].rglob("*.py")):
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


class WorkerGroup:
    """A registry entry for one warm worker group on a set of GPUs."""

    def __init__(self, pool_dir: Path, gpus: list[str], tp: int, sig: str):
        self.pool_dir, self.gpus, self.tp, self.sig = pool_dir, gpus, tp, sig
        key = "-".join(gpus)
        self.entry = pool_dir / f"srv-{key}.json"
        self.socket = pool_dir / f"srv-{key}.sock"
        self.log = pool_dir / f"srv-{key}.log"

    def info(self) -> dict | None:
        try:
            return json.loads(self.entry.read_text())
        except (OSError, ValueError):
            return None

    def alive(self) -> bool:
        info = self.info()
        if not info or not _pid_alive(info["pid"]):
            return False
        return info.get("sig") == self.sig and info.get("tp") == self.tp and self.socket.exists()

    def stop(self, grace: float = 5.0) -> None:
        info = self.info()
        if info:
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(grace)
                    s.connect(str(self.socket))
                    send_json(s, {"cmd": "exit"})
            except OSError:
                pass
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _pid_alive(info["pid"]):
                time.sleep(0.05)
            kill_group(info["pgid"])
        self.entry.unlink(missing_ok=True)
        self.socket.unlink(missing_ok=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child of ours still "exists"
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        pass
    try:  # so does one of a killed client's, where nothing reaps orphans (a container's init)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except OSError:
            return
        time.sleep(0.5)


def end_group(group: WorkerGroup, wait_s: float = 30.0) -> None:
    """Kill a worker group and wait until it is gone: its agent ended (the ranks die with it,
    worker.lifeline) and its rank 0 no longer computing (its busy lock free). Its registry entry goes."""
    info = group.info()
    if info:
        kill_group(info["pgid"])
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (_pid_alive(info["pid"]) or is_busy(group.socket)):
            time.sleep(0.05)
    group.entry.unlink(missing_ok=True)
    group.socket.unlink(missing_ok=True)


def _rank_errors(out_dir: Path) -> list[dict]:
    """The error reports the ranks wrote (a rank killed while writing leaves an unreadable one)."""
    errors = []
    for p in sorted(out_dir.glob("error.rank*.json")):
        try:
            errors.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return errors


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


class Launcher:
    def __init__(self, s: Settings):
        self.backend = s.backend
        self.device = s.device  # cpu | cuda
        self.lc = lc = s.launcher
        # one namespace per Slurm allocation: two jobs on a node may both see their GPUs as 0, 1, ...; private
        # to this user (lock files and sockets in world-writable /tmp), else refused naming launcher.pool_dir
        self.pool_dir = pool_folder(lc.pool_dir)
        if self.device == "cuda":
            ids = visible_ids(count_gpus())
        else:
            # CPU: a slot is a core this process may run on (at most launcher.cpu_slots of them); a worker
            # group is pinned to the cores it holds, so two jobs (of any run using this pool) never
            # measure on the same core; a case with more ranks than the pool has cores holds them all
            ids = cpu_slot_ids(lc.cpu_slots)
        self.pool = GpuPool(self.pool_dir / "locks", ids)
        self.sig = _code_signature({"backend": self.backend, "device": self.device,
                                    "multicast": lc.multicast, "env": lc.env,
                                    "python": sys.executable})

    # -- worker groups ------------------------------------------------------------------------
    def _warm_sets(self, tp: int, n: int | None = None) -> list[list[str]]:
        """Sets of ``n`` (default ``tp``) ids with a warm group of ``tp`` ranks."""
        sets = []
        for entry in self.pool_dir.glob("srv-*.json"):
            gpus = entry.stem[4:].split("-")
            if len(gpus) == (n or tp) and WorkerGroup(self.pool_dir, gpus, tp, self.sig).alive():
                sets.append(gpus)
        return sets

    def _retire_overlapping(self, gpus: list[str], keep: WorkerGroup) -> None:
        """Idle groups on any of our GPUs hold memory there: stop them (we hold the locks, so they are idle)."""
        if self.device != "cuda" or self.lc.keep_idle_groups:
            return
        for entry in self.pool_dir.glob("srv-*.json"):
            other = entry.stem[4:].split("-")
            if other != keep.gpus and set(other) & set(gpus):
                WorkerGroup(self.pool_dir, other, len(other), "").stop()

    def _start(self, group: WorkerGroup) -> subprocess.Popen:
        lc = self.lc
        extra = {"CUDA_VISIBLE_DEVICES": ",".join(group.gpus)} if self.device == "cuda" else {}
        if self.device == "cpu":
            extra["OMP_NUM_THREADS"] = str(lc.cpu_threads_per_rank)
        extra.update({k: str(v) for k, v in lc.env.items()})
        env = launch_env(os.environ, multicast=lc.multicast, extra=extra)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={group.tp}", "-m", "tptune.measure.worker.server",
               "--socket", str(group.socket), "--idle-timeout", str(lc.idle_timeout_s),
               "--device", self.device] + (["--preload", "te"] if self.backend == "te" else [])
        group.socket.unlink(missing_ok=True)
        log = open(group.log, "wb")
        pin = None
        if self.device == "cpu" and hasattr(os, "sched_setaffinity"):
            cores = {int(g) for g in group.gpus}
            pin = lambda: os.sched_setaffinity(0, cores)  # noqa: E731 - the worker group's ranks stay on its cores
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=pin)
        group.entry.write_text(json.dumps({"pid": proc.pid, "pgid": proc.pid, "sig": self.sig,
                                           "tp": group.tp, "gpus": group.gpus, "started": time.time()}))
        return proc

    # -- one attempt --------------------------------------------------------------------------
    def _busy_on(self, gpus: list[str], but: WorkerGroup | None = None) -> list[WorkerGroup]:
        """Groups computing a case on any of ``gpus`` (their busy lock held), other than ``but``."""
        out = []
        for entry in self.pool_dir.glob("srv-*.json"):
            other = entry.stem[4:].split("-")
            if set(other) & set(gpus) and (but is None or other != but.gpus) and is_busy(entry.with_suffix(".sock")):
                out.append(WorkerGroup(self.pool_dir, other, len(other), ""))
        return out

    def _end_orphans(self, gpus: list[str]) -> list[str]:
        """End every group computing on our GPUs: we hold their locks, so nobody waits for its case (a
        client killed while its case ran, or older code without the client watch). Returns their ids."""
        ended = []
        for g in self._busy_on(gpus):
            end_group(g)
            ended.append("-".join(g.gpus))
        return ended

    def _attempt_on(self, case: Case, mc: ModelConfig, out_dir: Path, settings: dict, gpus: list[str]) -> dict:
        group = WorkerGroup(self.pool_dir, gpus, case.tp, self.sig)
        try:
            return self._attempt(case, mc, out_dir, settings, gpus, group)
        except BaseException:
            # interrupted (Ctrl-C, SIGTERM: cli.main): the group goes before the GPUs' locks do
            end_group(group)
            raise

    def _attempt(self, case: Case, mc: ModelConfig, out_dir: Path, settings: dict, gpus: list[str],
                 group: WorkerGroup) -> dict:
        """Reach a worker group on ``gpus`` (a warm one, else start one), send it the case, await its
        answer; the failure, classified, where there is none."""
        orphans = self._end_orphans(gpus)
        started = not group.alive()
        t0 = time.monotonic()
        if started:
            failure = self._start_group(group, gpus, t0)
            if failure is not None:
                return failure
        t_ready = time.monotonic()
        request = {"case": case.id, "out_dir": str(out_dir.resolve()), "model": mc.to_dict(),
                   "settings": settings}
        answer = self._exchange(group, request, t_ready)
        if answer.timed_out:
            return self._unanswered(group, gpus, answer.accepted, started)
        t_done = time.monotonic()
        if answer.reply is None:
            return self._died(case, group, out_dir, answer.conn_error, gpus, started)
        return {"status": "ok", "reply": answer.reply, "gpus": gpus, "server_started": started,
                "connect_s": t_ready - t0, "request_s": t_done - t_ready,
                **({"ended_orphans": orphans} if orphans else {})}

    def _start_group(self, group: WorkerGroup, gpus: list[str], t0: float) -> dict | None:
        """Start a fresh group on ``gpus`` (idle ones overlapping them retired) and wait until it listens:
        None then, else the failure (it exited, or start-up took longer than startup_timeout_s from ``t0``)."""
        lc = self.lc
        self._retire_overlapping(gpus, group)
        group.stop()
        proc = self._start(group)
        deadline = t0 + lc.startup_timeout_s
        while not group.socket.exists():
            if proc.poll() is not None:
                return _failure("init", True, f"worker group exited during start-up (code "
                                f"{proc.returncode}): {_tail(group.log, 2000)}", gpus, True)
            if time.monotonic() > deadline:
                kill_group(proc.pid)
                return _failure("timeout", False, f"worker start-up exceeded {lc.startup_timeout_s}s",
                                gpus, True)
            time.sleep(0.05)
        return None

    def _exchange(self, group: WorkerGroup, request: dict, t_ready: float) -> _Answer:
        """Send ``request`` to the group and await its answer: "accepted" once the group starts the case,
        then the result, all within case_timeout_s from ``t_ready``."""
        timeout = self.lc.case_timeout_s
        reply, accepted = None, False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(timeout)
                s.connect(str(group.socket))
                send_json(s, request)
                reply = recv_json(s)
                if reply is not None and "accepted" in reply:   # the group started our case
                    accepted = True
                    s.settimeout(max(0.1, timeout - (time.monotonic() - t_ready)))
                    reply = recv_json(s)
        except (socket.timeout, TimeoutError):
            return _Answer(None, accepted, timed_out=True)
        except OSError as exc:
            return _Answer(None, accepted, conn_error=str(exc))
        return _Answer(reply, accepted)

    def _unanswered(self, group: WorkerGroup, gpus: list[str], accepted: bool, started: bool) -> dict:
        """No answer within case_timeout_s: the group goes; a hang of the case, unless it never started
        or another group computed on its GPUs (contended: transient)."""
        timeout = self.lc.case_timeout_s
        others = self._busy_on(gpus, but=group)
        end_group(group)
        if not accepted or others:
            # not a hang of this case: it waited behind another case, or shared its GPUs with another
            # group's: transient, measured again
            why = ("the worker group never started it (busy with another case)" if not accepted else
                   f"worker group(s) {', '.join('-'.join(g.gpus) for g in others)} computed on its GPUs")
            self._end_orphans(gpus)
            return _failure("contended", True, f"no result within case_timeout_s={timeout}s: "
                            f"{why}", gpus, started)
        return _failure("timeout", False, f"no result within case_timeout_s={timeout}s "
                        "(hang: e.g. a userbuffers wait or a stuck collective)", gpus, started)

    def _died(self, case: Case, group: WorkerGroup, out_dir: Path, conn_error: str, gpus: list[str],
              started: bool) -> dict:
        """The group closed the connection without a result: a rank failed (its error report says how)
        or died. The group is torn down."""
        info = group.info()
        time.sleep(1.0)  # let torch.distributed.run finish tearing the group down
        if info:
            kill_group(info["pgid"])
        group.entry.unlink(missing_ok=True)
        errors = _rank_errors(out_dir)
        if errors:
            return _reported_failure(case, errors, gpus, started)
        tail = _tail(group.log, 3000)
        kind, transient = classify_failure(tail)
        if kind in ("exception", "comm"):  # peers only saw the dead rank's sockets close
            kind, transient = "rank_died", True
        return _failure(kind, transient, f"worker group died without a report {conn_error}: {tail}",
                        gpus, started)

    def _settings_for(self, case: Case, op_settings: dict, faults: dict, profile: bool, check: bool) -> dict:
        return {"backend": self.backend, "timing": op_settings["timing"],
                "check": check and op_settings.get("check", False), "profile": profile,
                "fault": faults.get(case.id), "layer": _member_layer(case, op_settings.get("layer", {})),
                # TE calls atomic GEMMs a beta API: FP8 cases may use them only when the run opts in
                "te": {**op_settings.get("te", {}),
                       "allow_atomic_gemm": bool((op_settings.get("search") or {}).get("atomic_gemm", False))}}

    def _measure_once(self, case: Case, mc: ModelConfig, out_dir: Path, settings: dict, gpus: list[str],
                      attempts: list) -> dict:
        """One round of one case on the held GPUs; transient failures are retried."""
        out_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(1 + self.lc.retries):
            for stale in out_dir.glob("error.rank*"):
                stale.unlink()
            t0 = time.monotonic()
            res = self._attempt_on(case, mc, out_dir, settings, gpus)
            res["held_s"] = time.monotonic() - t0
            attempts.append({k: v for k, v in res.items() if k != "reply"})
            if res["status"] == "ok" or not res["error"]["transient"]:
                return res
        return res

    # -- a session --------------------------------------------------------------------------------
    def session(self, spec: SessionSpec, session_dir: Path, member_dirs: dict | None = None) -> dict:
        """Measure ``spec``'s members side by side on one warm worker group, in alternating rounds
        (search.rounds) until its stopping rule says so (SessionSpec). Writes <session_dir>/<variant>/run.json
        per member (Case.dir_name; ``member_dirs``: case id -> its folder instead) and session.json, which
        maps each member to its run.json (``runs``); returns the latter."""
        tp = spec.tp
        dir_of = {c.id: Path((member_dirs or {}).get(c.id, session_dir / c.dir_name)) for c in spec.members}
        session_dir.mkdir(parents=True, exist_ok=True)
        t_start, wall0 = time.time(), time.monotonic()
        with self._held(session_dir, tp) as (gpus, held_rec):
            t_locked = time.monotonic()
            key = self._partial_key(spec)
            measured = self._resumed(key, spec, session_dir) or _Measured.of(spec.members)
            resumed = len(measured.order)
            canary_rec, lead_rec = self._side_batches(spec, session_dir, gpus, measured.attempts)
            state, stop_reason = self._rounds(spec, dir_of, gpus, measured, session_dir, key)
            held = time.monotonic() - t_locked
            held_rec["until"] = time.time()
        if not stop_reason:
            stop_reason = "no member left to measure"
        side_attempts = measured.attempts.pop("_canary", []) + measured.attempts.pop("_lead_in", [])
        run_paths = self._write_member_runs(spec, session_dir, dir_of, measured, held_rec)
        min_r, max_r, budget = spec.round_bounds
        rec = {"session": spec.session_id, **({"settings": spec.record} if spec.record is not None else {}),
               "tp": tp, "members": spec.ids, "contenders": spec.contender_ids, "runs": run_paths,
               "order": measured.order, "rounds": len(measured.order), "min_rounds": min_r, "max_rounds": max_r,
               "margin": spec.margin, **({"tie_margin": spec.tie_margin} if spec.tie_margin is not None else {}),
               "futility": budget is not None, "stop": stop_reason, "leader": state.leader,
               "futile": state.futile,
               "ratios_to_leader": {c: (x.to_dict() if x else None) for c, x in state.ratios.items()},
               "failed": sorted(measured.failed), "held": held_rec, "canary": canary_rec, "lead_in": lead_rec,
               "started": t_start, "wall_s": time.monotonic() - wall0, "held_s": held,
               "gpu_s": held * tp, "group_starts": sum(a.get("server_started", False) for a_list in
                                                        [*measured.attempts.values(), side_attempts] for a in a_list),
               "resumed_after_rounds": resumed}
        write_text_atomic(session_dir / SESSION_JSON, json.dumps(rec, indent=1))
        (session_dir / PARTIAL_JSON).unlink(missing_ok=True)
        return rec

    # -- an interrupted session's rounds --------------------------------------------------------------
    def _partial_key(self, spec: SessionSpec) -> str:
        """What a recorded partial session must share with ``spec`` to be resumed: the code and launch
        settings (self.sig), the members and every setting the session measures and judges with."""
        key = {"sig": self.sig, "session": spec.session_id, "members": spec.ids, "contenders": spec.contender_ids,
               "op_settings": spec.op_settings, "margin": spec.margin, "tie_margin": spec.tie_margin,
               "faults": spec.faults, "always": list(spec.always or ())}
        return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]

    @staticmethod
    def _save_partial(key: str, session_dir: Path, measured: _Measured) -> None:
        """The rounds completed so far (written after each round; ``key``: _partial_key's): a session
        stopped before its end (a timeout, SIGINT, a lost node) resumes from them when it is run again as it
        was."""
        rec = {"key": key, "order": measured.order, "failed": measured.failed, "rounds": measured.rounds,
               "attempts": measured.attempts, "active": [c.id for c in measured.active]}
        write_text_atomic(session_dir / PARTIAL_JSON, json.dumps(rec, default=str))

    @staticmethod
    def _resumed(key: str, spec: SessionSpec, session_dir: Path) -> _Measured | None:
        """The measured rounds of an interrupted run of this very session (``key``: _partial_key's), else
        None (a partial record of other code or settings is removed: its rounds are not this session's)."""
        path = session_dir / PARTIAL_JSON
        try:
            rec = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            rec = {}
        if rec.get("key") != key or set(rec.get("rounds") or {}) != set(spec.ids):
            path.unlink(missing_ok=True)
            return None
        active = set(rec["active"])
        return _Measured({cid: [(r, res) for r, res in rs] for cid, rs in rec["rounds"].items()},
                         {cid: list(a) for cid, a in rec["attempts"].items()}, dict(rec["failed"]),
                         list(rec["order"]), [c for c in spec.members if c.id in active])

    @contextmanager
    def _held(self, session_dir: Path, tp: int):
        """The session's lock, then the ids of its worker group (warm ones preferred); yields them and the
        record of what was held (session.json and every member's run.json keep it)."""
        need = tp if self.device == "cuda" else min(tp, len(self.pool.ids))
        what = "GPUs" if self.device == "cuda" else "CPU worker slots"
        with _session_lock(session_dir) as waited_s, \
                self.pool.acquire(need, prefer=self._warm_sets(tp, need), what=what,
                                  waiting_for=f"session {_session_name(session_dir)}",
                                  owner=_run_root(session_dir)) as gpus:
            yield gpus, {"device": self.device, "ids": list(gpus), "pool": str(self.pool.lock_dir),
                         "ranks": tp, "session_lock": str(session_dir / SESSION_LOCK),
                         "waited_for_session_s": waited_s, "waited_for_pool_s": self.pool.last_wait_s,
                         "pool_held_by": self.pool.last_wait_by, "pid": os.getpid(), "from": time.time()}

    def _side_batches(self, spec: SessionSpec, session_dir: Path, gpus: list[str],
                      attempts: dict[str, list]) -> tuple[dict | None, dict | None]:
        """The drift canary's batch and the lead-in's, before round 0: (canary, lead-in) records, None where off."""
        canary_rec = lead_rec = None
        if spec.canary is not None:
            canary_rec = self._side_batch(spec.canary, spec, session_dir / "canary", gpus,
                                          attempts.setdefault("_canary", []))
        if spec.timing.get("lead_in", False) and spec.members:
            # One untimed round of the first member before round 0 (off by default): round 0's first
            # member reads off against its later rounds (x2: -0.5%, 401 pairs in results/), but on
            # one H100 this lead-in made that worse, -5.9% [-7.8, -4.0] against +1.6% [+0.3, +3.0]
            # without it (12 sessions each, results/lead-in-h100): the card's transient outlasts one
            # member. benchmarks/lead_in.py measures it on a node.
            lead_rec = self._side_batch(spec.members[0], spec, session_dir / "lead_in", gpus,
                                        attempts.setdefault("_lead_in", []))
        return canary_rec, lead_rec

    def _rounds(self, spec: SessionSpec, dir_of: dict[str, Path], gpus: list[str],
                measured: _Measured, session_dir: Path, key: str) -> tuple[SessionState, str]:
        """Rounds of the active members in rotation until the stopping rule says so; after min_rounds
        only those with something left to say are measured (rounds.measured_next). A resumed session
        (``measured`` from its partial record) goes on from its next round; each round is kept under
        ``key``. Returns the last state and why it stopped ("" when no member was left)."""
        min_r, max_r, budget = spec.round_bounds
        contenders = spec.contender_ids
        r = len(measured.order)
        # each member's point over its rounds so far
        points = {cid: _measured_point(cid, spec.session_id, rs) for cid, rs in measured.rounds.items() if rs}

        def judged():   # the state after round r - 1: (state, stop?, why)
            st = session_state(points, contenders, spec.margin, leader_among=[c.id for c in measured.active],
                               tie_margin=spec.tie_margin, budget=budget)
            return (st, *should_stop(st, r, min_r, max_r))

        state, stop, stop_reason = judged() if r else (session_state({}, contenders, spec.margin,
                                                                     tie_margin=spec.tie_margin), False, "")
        while measured.active and not stop:
            order = rotation(measured.active, r)
            self._round(spec, order, r, dir_of, gpus, measured)
            # only the members this round measured have new rounds: the others' points stand
            points.update({c.id: _measured_point(c.id, spec.session_id, measured.rounds[c.id]) for c in order
                           if measured.rounds[c.id] and measured.rounds[c.id][-1][0] == r})
            r += 1
            measured.active = [c for c in measured.active if c.id not in measured.failed]
            state, stop, stop_reason = judged()
            if not stop and r >= min_r:
                keep = set(measured_next(state, [c.id for c in measured.active], spec.references, spec.always or ()))
                measured.active = [c for c in measured.active if c.id in keep]
            self._save_partial(key, session_dir, measured)
        return state, stop_reason

    def _round(self, spec: SessionSpec, order: list[Case], r: int, dir_of: dict[str, Path], gpus: list[str],
               measured: _Measured) -> None:
        """Round ``r``: each member of ``order`` once; a member's first round carries the evidence."""
        measured.order.append([c.id for c in order])
        for case in order:
            first = not measured.rounds[case.id]
            settings = self._settings_for(case, spec.op_settings, spec.faults,
                                          profile=first and spec.evidence and spec.profile,
                                          check=first and spec.evidence)
            n = host_attempts(measured.rounds[case.id])
            if n is not None:
                settings = {**settings, "timing": {**settings["timing"], "host_attempts": n}}
            res = self._measure_once(case, spec.model, dir_of[case.id], settings, gpus, measured.attempts[case.id])
            if res["status"] == "ok":
                measured.rounds[case.id].append((r, res))
            else:
                measured.failed[case.id] = res

    def _write_member_runs(self, spec: SessionSpec, session_dir: Path, dir_of: dict[str, Path],
                           measured: _Measured, held_rec: dict) -> dict[str, str]:
        """Every member's run.json; returns where each is, relative to the session's folder."""
        run_paths = {}
        for case in spec.members:
            run = assemble_member_run(case, spec.model, {"backend": self.backend, "device": self.device},
                                      self._settings_for(case, spec.op_settings, spec.faults, True, True),
                                      measured.rounds[case.id], measured.failed.get(case.id),
                                      measured.attempts[case.id], spec.session_id)
            run["held"] = held_rec
            write_run_json(dir_of[case.id], run)
            run_paths[case.id] = os.path.relpath(dir_of[case.id] / RUN_JSON, session_dir)
        return run_paths

    def _side_batch(self, case: Case, spec: SessionSpec, out_dir: Path, gpus: list[str], attempts: list) -> dict:
        """One batch outside the session's rounds: the drift canary (a fixed reference re-measured at every
        session's start) or the lead-in (the first member, once, before round 0)."""
        settings = self._settings_for(case, spec.op_settings, spec.faults, profile=False, check=False)
        t = time.time()
        res = self._measure_once(case, spec.model, out_dir, settings, gpus, attempts)
        if res["status"] != "ok":
            return {"case": case.id, "t": t, "ms": None, "error": res["error"]["message"][:300]}
        p = _measured_point(case.id, None, [(0, res)])
        return {"case": case.id, "t": t, "ms": p.timing[METRIC].median,
                "host_ahead": p.host_ahead, "sm_mhz": (p.clock or {}).get("sm_mhz")}

    def profile(self, case: Case, mc: ModelConfig, out_dir: Path, op_settings: dict) -> dict:
        """Measure one case alone (rounds as configured, nothing beside it); writes and returns run.json."""
        faults = {case.id: op_settings.get("fault")} if op_settings.get("fault") else {}
        self.session(SessionSpec(f"single:{case.id}", [case], mc, op_settings, faults=faults), out_dir,
                     member_dirs={case.id: out_dir})
        return read_run_json(out_dir)


@dataclass
class _Answer:
    """A worker group's answer to one request."""
    reply: dict | None     # None: none came (timed out, or the group closed the connection)
    accepted: bool         # the group said it started the case
    timed_out: bool = False
    conn_error: str = ""   # why the connection failed, where it did


@dataclass
class _Measured:
    """What a session's rounds measured so far: each member's ok rounds [(round, attempt result)], its
    attempts (and the canary's and lead-in's, under "_canary" and "_lead_in"), the failure that ended
    it, and each round's order."""
    rounds: dict[str, list]
    attempts: dict[str, list]
    failed: dict[str, dict] = field(default_factory=dict)
    order: list[list[str]] = field(default_factory=list)
    active: list = field(default_factory=list)   # the members the next round measures

    @classmethod
    def of(cls, members) -> _Measured:
        return cls({c.id: [] for c in members}, {c.id: [] for c in members}, active=list(members))


def _reported_failure(case: Case, errors: list[dict], gpus: list[str], started: bool) -> dict:
    """A failure from the ranks' error reports. A rank that lost its peer only reports the symptom:
    classify by the others."""
    root = [e for e in errors if not _peer_lost(e["message"])] or errors
    msg = "; ".join(f"rank {e['rank']}: {e['type']}: {e['message']}"
                    for e in root + [e for e in errors if e not in root])
    kind, transient = classify_failure(" ".join(f"{e['message']} {e['traceback']}" for e in root))
    if kind == "comm" and len(root) < case.tp and root is errors:
        kind, msg = "rank_died", f"a rank died without a report; {msg}"
    return _failure(kind, transient, msg, gpus, started, tracebacks=[e["traceback"] for e in errors])

SESSION_LOCK = ".measuring.lock"


def _run_root(session_dir: Path) -> str:
    """The run folder a session belongs to (``outputs/<run>`` of ``outputs/<run>/sessions/...``), absolute: what
    its pool locks name as their owner, so a wait tells the run's own jobs from others'."""
    parts = Path(os.path.abspath(session_dir)).parts
    at = max((i for i, p in enumerate(parts) if p in ("sessions", "calibration")), default=len(parts) - 1)
    return str(Path(*parts[:at]))


def _session_name(session_dir: Path) -> str:
    """``qkv/tp2/point`` of ``outputs/<run>/sessions/qkv/tp2/point``: what the progress line calls it."""
    parts = session_dir.parts
    at = max((i for i, p in enumerate(parts) if p == "sessions"), default=len(parts) - 2)
    return "/".join(parts[at + 1:]) or session_dir.name


@contextmanager
def _session_lock(session_dir: Path, timeout: float = 24 * 3600):
    """Hold the session's lock while measuring it: another process measuring the same session (a rerun
    beside an orphaned job of a killed snakemake, a second run in this folder) is waited for, never
    measured beside. Yields the seconds waited."""
    session_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    told = False
    while True:
        fh, holder = take_lock(session_dir / SESSION_LOCK)
        if fh is not None:
            break
        if not told:
            print(f"{session_dir}: being measured by another process (pid {holder}); waiting for it",
                  file=sys.stderr, flush=True)
            told = True
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{session_dir}: still being measured by another process after {timeout:.0f}s")
        time.sleep(0.5)
    try:
        yield time.monotonic() - t0
    finally:
        fh.close()


def host_attempts(rounds: list) -> int | None:
    """The host-ahead attempts of a member's next batch: one where its last batch fell behind after every
    attempt on some rank (worker.timing: a retry grows the sleep, which a host-bound block's launches
    outrun every time), else None (the worker's own count). A batch that gets ahead restores the count."""
    if not rounds:
        return None
    batches = [x.get("batch") or {} for x in rounds[-1][1]["reply"]["ranks"]]
    behind = [b for b in batches if b.get("timing") == "gpu_host_ahead" and b.get("host_ahead") is False]
    return 1 if behind else None


def _member_layer(case: Case, layer: dict) -> dict:
    """The layer settings a member is measured with: of a packed session's bins (layer.bins) only its own,
    so its run.json records the lengths it ran; none for a member on unpacked input."""
    if "bins" not in layer:
        return layer
    rest = {k: v for k, v in layer.items() if k != "bins"}
    if case.pack is None:
        return rest
    return {**rest, "bins": {case.pack.key: layer["bins"][case.pack.key]}}


def _measured_point(case_id: str, session_id: str | None, rounds: list) -> MeasuredPoint:
    """The member's point over its rounds so far, as the stopping rule reads it."""
    return MeasuredPoint.from_dict(_round_point(case_id, session_id, rounds), f"{case_id} (measuring)")


def _round_point(case_id: str, session_id: str | None, rounds: list) -> dict:
    """A point (search.points layout) from a member's rounds [(round id, ok attempt result)]."""
    per_round, all_it, host, ahead, batches = [], {"fwd_ms": [], "bwd_ms": [], "total_ms": []}, [], [], []
    # timed iterations per round and metric: a GPU-bound op's window sets them from each round's probe
    # (a packed block's forward-only batch, fwd_only_ms, has its own)
    counts: dict[str, list[int]] = {}
    for rid, res in rounds:
        ranks = sorted(res["reply"]["ranks"], key=lambda x: x["rank"])
        slow = slowest_rank([x["samples"] for x in ranks])
        for k in slow:
            all_it.setdefault(k, []).extend(slow[k])
            counts.setdefault(k, []).append(len(slow[k]))
        per_round.append((rid, {k: statistics.median(v) for k, v in slow.items()}))
        bs = [x.get("batch") or {} for x in ranks]
        host.append(max(b.get("host_ms", 0.0) for b in bs))
        ahead.append(all(b.get("host_ahead", True) for b in bs))
        last = [(b.get("attempts") or [{}])[-1] for b in bs]   # each rank's attempt that counted
        batches.append({"round": rid, "host_ms": host[-1], "host_ahead": ahead[-1], "timing": bs[0].get("timing"),
                        "attempts": max(len(b.get("attempts") or []) for b in bs),
                        "slept_ms": max(a.get("slept_ms", 0.0) for a in last),
                        "enqueue_ms": max(a.get("enqueue_ms", 0.0) for a in last),
                        "preroll": last[0].get("preroll"), "iters": last[0].get("iters"), "check": last[0].get("check"),
                        "clock": merge_ranks([a.get("clock") for a in last]), "evidence": host_evidence(bs)})
        fwd_only = [b["forward_only"] for b in bs if b.get("forward_only")]
        if fwd_only:   # a packed block's forward-only batch: whether its host stayed ahead too
            batches[-1]["forward_only"] = {"host_ahead": all(b.get("host_ahead", True) for b in fwd_only),
                                           "attempts": max(len(b.get("attempts") or []) for b in fwd_only),
                                           "host_ms": max(b.get("host_ms", 0.0) for b in fwd_only)}
    timing = {}
    for k, v in all_it.items():
        st = stats(v)
        vals = [pr[k] for _, pr in per_round]
        st.update({"iter_median": st["median"], "median": statistics.median(vals),
                   "rounds": [round(x, 6) for x in vals], "round_ids": [rid for rid, _ in per_round],
                   "round_iters": counts.get(k, [])})
        timing[k] = st
    gpu = timing["total_ms"]["median"]
    host_ms = statistics.median(host)
    on_gpu = all(b["timing"] == "gpu_host_ahead" for b in batches)  # on CPU the host is the device
    point = {"case": case_id, "status": "ok", "session": session_id, "timing": timing,
             "host": {"host_ms": host_ms, "gpu_ms": gpu, "host_bound": on_gpu and host_ms >= gpu,
                      "host_ahead": all(ahead), "batches": batches},
             "clock": clock_over_rounds([b["clock"] for b in batches])}
    shapes = shape_rounds(rounds)
    if shapes:
        point["shapes"] = shapes
    return point


def shape_rounds(rounds: list) -> list[dict]:
    """Per shape of an op measured at several (worker.harness.run_case): its share, and per round the
    median over iterations of the slowest rank's time, as timing[...]["rounds"] is for the mix. [] for an
    op of one shape."""
    out: list[dict] = []
    for rid, res in rounds:
        ranks = sorted(res["reply"]["ranks"], key=lambda x: x["rank"])
        if not ranks[0].get("shapes"):
            return []
        for j, sh in enumerate(ranks[0]["shapes"]):
            if len(out) <= j:
                out.append({k: sh[k] for k in ("what", "k_in", "n_out", "layers", "share")}
                           | {"round_ids": [], **{k: [] for k in ("fwd_ms", "bwd_ms", "total_ms")}})
            slow = slowest_rank([x["shapes"][j]["samples"] for x in ranks])
            out[j]["round_ids"].append(rid)
            for k in ("fwd_ms", "bwd_ms", "total_ms"):
                out[j][k].append(round(statistics.median(slow[k]), 6))
    for sh in out:
        sh["median_ms"] = statistics.median(sh["total_ms"])
    return out


def _failure(kind: str, transient: bool, message: str, gpus, started, tracebacks=None) -> dict:
    return {"status": "failed", "gpus": gpus, "server_started": started,
            "error": {"kind": kind, "transient": transient, "message": message.strip()[:6000],
                      "tracebacks": tracebacks or []}}


def assemble_member_run(case: Case, mc: ModelConfig, run_settings: dict, settings: dict, rounds: list,
                        failure: dict | None, attempts: list, session_id: str) -> dict:
    """A member's run.json: its rounds (or why it failed), environment and launch bookkeeping."""
    status = "ok" if rounds else "failed"
    err = None
    if failure is not None:
        err = failure["error"]
        if rounds:  # failed in a later round: its earlier rounds stand, the failure is recorded
            err = {**err, "after_rounds": len(rounds)}
    elif not rounds:
        err = {"kind": "exception", "transient": False, "message": "never measured", "tracebacks": []}
    run = {
        "case": case.id, "op": case.op, "tp": case.tp, "variant": case.variant_id,
        "backend": run_settings["backend"], "device": run_settings["device"], "session": session_id,
        "status": status, "error": err,
        "model": mc.to_dict(), "settings": {k: v for k, v in settings.items() if k not in ("fault", "profile")},
        "attempts": attempts, "wall_s": sum(a.get("held_s", 0.0) for a in attempts),
        "tptune_version": __version__,
    }
    if rounds:
        point = _round_point(case.id, session_id, rounds)
        run["timing"] = point["timing"]
        run["host"] = point["host"]
        run["clock"] = point["clock"]
        if point.get("shapes"):
            run["shapes"] = point["shapes"]   # per-shape rounds of an op measured at its model's mix
        first = rounds[0][1]
        ranks = sorted(first["reply"]["ranks"], key=lambda r: r["rank"])
        run["timing"]["per_rank_median_total_ms"] = [stats(r["samples"]["total_ms"])["median"] for r in ranks]
        run["traces"] = [r["trace"] for r in ranks if r["trace"]]
        run["correctness"] = ranks[0].get("correctness")
        if ranks[0].get("pack") is not None:
            run["pack"] = ranks[0]["pack"]   # a packed block's input: T, real tokens, padding, lengths
        run["environment"] = first["reply"]["environment"]
        launches = [res for _, res in rounds]

        def slowest(key):   # summed over rounds, the slowest rank of each
            return sum(max(r.get(key, 0.0) for r in res["reply"]["ranks"]) for res in launches)
        run["launch"] = {
            "gpus": first["gpus"], "server_started": any(a.get("server_started") for a in attempts),
            "startup": next((res["reply"].get("startup") for res in launches if res["reply"].get("startup")), None),
            "init_s": slowest("init_s"),
            "measure_s": slowest("measure_s"), "case_s": slowest("total_s"),
            # the rest of held_s: teardown, the worker's request handling, the client's round trip
            "close_s": slowest("close_s"), "serve_s": slowest("serve_s"),
            "rounds": len(rounds), "held_s": run["wall_s"],
        }
    return run


def write_run_json(out_dir: Path, run: dict) -> Path:
    path = out_dir / RUN_JSON
    write_text_atomic(path, json.dumps(run, indent=1))
    return path


def read_run_json(out_dir: Path) -> dict:
    return json.loads((Path(out_dir) / RUN_JSON).read_text())
