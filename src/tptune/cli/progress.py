"""The progress line a person reads while a run measures: one per finished session, on the console.

    tptune: session 14/37 done (qkv tp4 knobs step3, 6.2 s) · 2 min 41 s elapsed · about 3 min 10 s left

- done: the sessions this snakemake invocation finished (records.progress: the lines after its start);
- planned so far: done + the sessions not yet done that the run's records still plan (search.ahead) or
  that this invocation's DAG held when it started (the start line's "sessions": what a rerun re-measures);
  or the prediction's count (wall_predicted.json's sessions_planned) where that is larger, the prediction
  is this invocation's (below) and the searches are not over: "of at most N" where that count is an upper
  bound (every TP counted, the TP decision may stop earlier), and once the searches are over the last line
  says how many of those the TP decision needed;
- elapsed: since this invocation's start (its onstart; without one, since its first session's start);
- time left: with a prediction made for this invocation, a blend of the prediction's time for the share
  not yet done and the pace so far (elapsed / done per session left), weighted by the share done, so it
  starts at the prediction and ends at the measured pace; without one, the pace alone. A prediction is
  the whole run's, so it is this invocation's only where no session of the run was recorded before it
  started (a rerun that re-measures one session is timed by its own pace). The confirm stage follows the
  sessions: where the prediction counts it (wall_predicted.json's confirm_s) and its confirm.json is not yet
  written, its predicted seconds are added to the sessions' time left, and the last line says it follows.

The line goes to the console the workflow's jobs hold (TPTUNE_CONSOLE_FD, the Snakefile's shell prefix:
Snakemake's own stderr, where a job's stdout and stderr go to its log; under Slurm, the job's log), else
to stderr. Nothing here may stop or fail a session: any error drops the line's estimate, or the line.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from tptune.measure.console import CONSOLE_ENV, say  # noqa: F401 - the console line, re-exported
from tptune.records import progress
from tptune.records.run_dir import SESSION_JSON, RunDir
from tptune.search.ahead import Ahead, sessions_ahead



@dataclass(frozen=True)
class Estimate:
    done: int
    planned: int | None          # None: unknown
    elapsed_s: float | None
    left_s: float | None         # None: unknown
    from_start: bool = True      # elapsed since the invocation's start (else since its first session's)
    final: bool = False          # a whole run whose searches are over: no session beyond the planned ones
    confirm_s: float = 0.0       # the confirm stage still to run after the sessions, predicted seconds
    at_most: bool = False        # ``planned`` is the prediction's count of every TP, an upper bound
    plan_count: int | None = None   # the searches over: the prediction's upper bound they fell short of


def time_left(done: int, planned: int | None, elapsed_s: float | None,
              predicted_s: float | None = None) -> float | None:
    """Seconds left (module doc): ``predicted_s`` is the whole invocation's predicted wall time, None where
    there is none for it."""
    if elapsed_s is None or planned is None or done <= 0 or planned < done:
        return None
    share = done / planned
    pace_left = elapsed_s / done * (planned - done)
    if predicted_s is None:
        return pace_left
    return (1 - share) * predicted_s * (1 - share) + share * pace_left


def estimate(run: RunDir, ahead: Ahead | None, now: float | None = None) -> Estimate:
    """The progress of the invocation running ``run`` now, after its latest finished session; ``ahead``:
    the sessions still planned (search.ahead), None where unknown."""
    now = time.time() if now is None else now
    inv = progress.current(run)
    done = len(inv.sessions)
    start = inv.earliest
    elapsed = now - start if start is not None else None
    fresh = inv.start is not None and _fresh(run, inv.start)
    whole = progress.prediction(run)
    pred = whole if fresh else None
    confirm_s = whole.confirm_s if whole is not None and not run.confirm_json.exists() else 0.0
    planned = None
    if ahead is not None or inv.scheduled is not None:
        todo = set(ahead.sessions if ahead is not None else ()) | set(inv.scheduled or ())
        planned = done + len(todo - {str(e.get("session")) for e in inv.sessions})
    at_most, plan_count = False, None
    if pred is not None and pred.sessions is not None and not (ahead is not None and ahead.final):
        at_most = pred.upper_bound and pred.sessions > max(planned or 0, done)
        planned = max(planned or 0, pred.sessions, done)
    elif pred is not None and pred.upper_bound and pred.sessions and planned is not None and planned < pred.sessions:
        plan_count = pred.sessions      # the TP decision stopped before every TP the prediction counted
    left = time_left(done, planned, elapsed, pred.wall_s - pred.confirm_s if pred else None)
    return Estimate(done, planned, elapsed, None if left is None else left + confirm_s, inv.start is not None,
                    fresh and ahead is not None and ahead.final, confirm_s, at_most, plan_count)


def _fresh(run: RunDir, start: float) -> bool:
    """No session of the run was recorded before the invocation that started at ``start``."""
    for path in run.sessions.glob(f"**/{SESSION_JSON}"):
        try:
            if path.stat().st_mtime < start:
                return False
        except OSError:
            continue
    return True


def duration(s: float) -> str:
    """2 min 41 s, 1 h 3 min, 6.2 s."""
    if s < 10:
        return f"{s:.1f} s"
    s = round(s)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def line(name: str, wall_s: float | None, est: Estimate) -> str:
    count = (f"{est.done} of at most {est.planned}" if est.at_most and est.planned is not None else
             f"{est.done}/{est.planned}" if est.planned is not None else f"{est.done}")
    what = name.replace("/", " ") + (f", {duration(wall_s)}" if wall_s is not None else "")
    parts = [f"tptune: session {count} done ({what})"]
    if est.elapsed_s is not None:
        parts.append(f"{duration(est.elapsed_s)} elapsed" + ("" if est.from_start else " since the first session"))
    then = (f"the confirm stage (about {duration(est.confirm_s)}) and the report follow" if est.confirm_s
            else "the report follows")
    if est.planned is not None and est.planned == est.done:
        fell = (f" (the TP decision needed {est.planned} of the at most {est.plan_count} sessions the plan counted)"
                if est.plan_count else "")
        parts.append(f"no session left{fell}: {then}" if est.final else "no further session known yet")
    elif est.left_s is not None:
        parts.append(f"about {duration(est.left_s)} left")
    else:
        parts.append("time left unknown")
    return " · ".join(parts)


def session_finished(s, run: RunDir, name: str, rec: dict) -> None:
    """Record the finished session and say the progress line (module doc)."""
    try:
        progress.record_session(run, name, rec)
        try:
            ahead = sessions_ahead(s, run)
        except Exception:       # noqa: BLE001 - a record the estimate cannot read only drops the count
            ahead = None
        say(line(name, rec.get("wall_s"), estimate(run, ahead)))
    except Exception:           # noqa: BLE001 - progress never fails a measured session
        pass
