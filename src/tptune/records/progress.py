"""The run's progress record, progress.jsonl: one JSON line per event, appended by whoever makes it.

- ``{"event": "start", "t", "pid", "sessions"}``: a snakemake invocation took the run (its onstart, after
  records.run_lock), with the sessions its DAG's jobs measure as far as it knew then;
- ``{"event": "session", "session", "kind", "tp", "started", "wall_s", "finished", "pid"}``: a measuring job
  finished a session (cli.progress).

Several jobs finish sessions at once (TP 2 sessions on two GPU pairs), so each line is one ``write`` on a
descriptor opened with O_APPEND: the kernel places every such write at the end whole, and lines from
concurrent jobs never interleave (on a local file system; NFS does not promise it, and a garbled line is
then skipped by the reader). Nothing here may stop a run: a write that fails is dropped, and a line that
is not JSON is not read.

Also the run's wall-time files, read for the progress line and the report: wall_s.txt (measured),
wall_predicted.json (predicted before measuring) and wall_s.8gpu-predicted.txt (an 8-GPU node, replayed).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from tptune.errors import TptuneError
from tptune.records.files import open_no_follow
from tptune.records.run_dir import RunDir

KINDS = ("steps", "points", "blocks")


def session_kind(name: str) -> str:
    """<op>/tp<N>/<dim>/step<k> -> steps; <op>/tp<N>/point -> points; layer/tp<N> -> blocks."""
    parts = Path(name).parts
    if parts and parts[0] == "layer":
        return "blocks"
    return "points" if parts and parts[-1] == "point" else "steps"


def append(path: Path, event: dict) -> bool:
    """One line, in one write (module doc); False where it could not be written, or where a link or another
    non-regular file stands at ``path`` (never written through: records.files.open_no_follow)."""
    line = (json.dumps(event, sort_keys=True) + "\n").encode()
    try:
        fd = open_no_follow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    except (OSError, TptuneError):
        return False
    try:
        return os.write(fd, line) == len(line)
    except OSError:
        return False
    finally:
        os.close(fd)


def record_start(run: RunDir, now: float | None = None, sessions: list[str] | None = None) -> bool:
    """A snakemake invocation took the run: the progress line's elapsed time counts from here.
    ``sessions``: those its jobs measure as far as its DAG knew then (None: unknown)."""
    event = {"event": "start", "t": time.time() if now is None else now, "pid": os.getpid()}
    if sessions is not None:
        event["sessions"] = sorted(sessions)
    return append(run.progress_jsonl, event)


def record_session(run: RunDir, name: str, rec: dict, now: float | None = None) -> dict:
    """A finished session (``rec``: its session.json record); returns the line written (or not)."""
    started, wall = rec.get("started"), rec.get("wall_s")
    event = {"event": "session", "session": name, "kind": session_kind(name), "tp": rec.get("tp"),
             "started": started, "wall_s": wall, "finished": time.time() if now is None else now,
             "pid": os.getpid()}
    append(run.progress_jsonl, event)
    return event


def read_events(path: Path) -> list[dict]:
    """Every whole event line of the record, in file order; [] where there is none."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if isinstance(ev, dict) and ev.get("event") in ("start", "session"):
            out.append(ev)
    return out


def _num(x) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


@dataclass
class Invocation:
    """The sessions one snakemake invocation finished. ``start``: its onstart's time, None where no start
    was recorded (a session measured by hand, or a run begun before the record existed): then
    ``earliest`` (the first recorded session's start) stands in."""
    start: float | None
    scheduled: frozenset[str] | None = None     # the sessions its DAG held at the start, None: unknown
    sessions: list[dict] = field(default_factory=list)

    @property
    def earliest(self) -> float | None:
        starts = [s for s in (_num(e.get("started")) for e in self.sessions) if s is not None]
        return self.start if self.start is not None else (min(starts) if starts else None)

    @property
    def last_finished(self) -> float | None:
        ends = [s for s in (_num(e.get("finished")) for e in self.sessions) if s is not None]
        return max(ends) if ends else None


def invocations(events: list[dict]) -> list[Invocation]:
    """The record split at each start event, in order (sessions before the first start form an
    invocation with no start)."""
    out: list[Invocation] = []
    for ev in events:
        if ev.get("event") == "start":
            listed = ev.get("sessions")
            out.append(Invocation(_num(ev.get("t")), frozenset(map(str, listed)) if isinstance(listed, list) else None))
        elif ev.get("event") == "session":
            if not out:
                out.append(Invocation(None))
            out[-1].sessions.append(ev)
    return out


def current(run: RunDir) -> Invocation:
    """The latest invocation (the one running, for a job of the run)."""
    runs = invocations(read_events(run.progress_jsonl))
    return runs[-1] if runs else Invocation(None)


# -- the run's wall-time files -------------------------------------------------------------------------
def measured_wall_s(run: RunDir) -> float | None:
    """wall_s.txt's seconds, None where it is missing or not a number."""
    return _seconds_file(run.wall_s_txt)


def confirm_in_wall_s(run: RunDir) -> float:
    """Seconds of the run's measured wall time its workflow spent in the confirm stage: confirm.json's wall_s
    where config.json has the stage on (0 where it was off, ran apart by ``tptune confirm``, or a file is
    missing or unreadable)."""
    try:
        cfg = json.loads(run.config_json.read_text())
        rec = json.loads(run.confirm_json.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return 0.0
    if not isinstance(cfg, dict) or not isinstance(rec, dict) or (cfg.get("confirm") or {}).get("enabled") is not True:
        return 0.0
    w = _num(rec.get("wall_s"))
    return w if w is not None and w > 0 else 0.0


def predicted_8gpu_wall_s(run: RunDir) -> float | None:
    return _seconds_file(run.wall_8gpu_predicted_txt)


def _seconds_file(path: Path) -> float | None:
    try:
        x = float(path.read_text().split()[0])
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    return x if x >= 0 else None


@dataclass(frozen=True)
class Prediction:
    """wall_predicted.json: the run's wall time predicted before measuring, on ``gpus`` GPUs."""
    wall_s: float
    sessions: int | None
    gpus: int | None
    basis: str | None
    confirm_s: float = 0.0      # the confirm stage's share of wall_s: it follows the sessions
    unit: str = "GPUs"          # what ``gpus`` counts: GPUs, or a CPU run's worker slots
    upper_bound: bool = False   # ``sessions`` counts every TP, which the TP decision may stop short of


def prediction(run: RunDir) -> Prediction | None:
    """The run's prediction, None where the file is missing or holds no positive predicted_wall_s."""
    try:
        rec = json.loads(run.wall_predicted_json.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict):
        return None
    wall, n, gpus = _num(rec.get("predicted_wall_s")), _num(rec.get("sessions_planned")), _num(rec.get("gpus"))
    if wall is None or wall <= 0:
        return None
    basis = rec.get("basis")
    confirm = _num(rec.get("confirm_s"))
    # a record without its unit: a rough (CPU backend) prediction was laid on the worker pool's slots
    unit = rec.get("unit") if rec.get("unit") in ("GPUs", "worker slots") else \
        "worker slots" if rec.get("rough") is True else "GPUs"
    notes = rec.get("notes") if isinstance(rec.get("notes"), list) else []
    upper = rec["upper_bound"] is True if "upper_bound" in rec else \
        any(isinstance(x, str) and "an upper bound" in x for x in notes)   # a record before the key: its note
    return Prediction(wall, int(n) if n and n > 0 else None, int(gpus) if gpus else None,
                      basis if isinstance(basis, str) else None,
                      confirm if confirm is not None and 0 < confirm < wall else 0.0, unit, upper)
