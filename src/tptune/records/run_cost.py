"""Where a tuning run's time went, from its small files (measurements.csv, sessions/**/session.json,
wall_s.txt when present): benchmarks/run_cost.py prints it, ``tptune figures``' ``run_cost`` kind quotes it.

Per op and for the whole run, per member-round (a setting measured once in a session's round, its
columns summed over the member's rounds and divided by them):

- window: the timed window's GPU time (timed_s);
- hold: the sleep and the pre-roll before it (hold_s);
- warm-up etc.: the rest of the measurement (measure_s - timed_s - hold_s): warm-up and probe
  iterations, the ranks' syncs;
- build, teardown: init_s, close_s;
- evidence: profiler traces and the numerics check (case_s - init_s - measure_s);
- handling: what the request held beyond the case (wall_s - case_s - close_s): the worker's handling
  and the client's round trip.

The session timeline (each session.json's ``started`` and ``wall_s``): the sessions per kind (knob or
bisection steps, TP points, blocks) and their seconds; the span from the first session's start to the
last one's end; the time inside it when no session ran (between sessions: Snakemake, the checkpoint's
decision, the next job's start); the median gap before a session on its GPUs (its start minus the latest
end of an earlier session that held one of its GPUs, ``held.ids``; a run that records no ids counts as one
GPU set). Sessions that ran at once (TP 2 sessions on the two GPU pairs of a 4-GPU node) count once in
the time busy.
"""
from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

PARTS = (("window", "timed_s"), ("hold", "hold_s"), ("warm-up etc.", None), ("build", "init_s"),
         ("teardown", "close_s"), ("evidence", None), ("handling", None))
KINDS = ("steps", "points", "blocks")


def _num(x: str | None) -> float | None:
    return float(x) if x not in (None, "") else None


def row_parts(row: dict) -> dict[str, float | None]:
    """Seconds per part (module doc) of one measurements.csv row, over all its rounds."""
    g = {k: _num(row.get(k)) for k in ("timed_s", "hold_s", "measure_s", "init_s", "close_s", "case_s", "wall_s")}
    out = {name: g[col] for name, col in PARTS if col}

    def diff(a, *bs):
        return None if a is None or any(b is None for b in bs) else a - sum(bs)
    out["warm-up etc."] = diff(g["measure_s"], g["timed_s"], g["hold_s"])
    out["evidence"] = diff(g["case_s"], g["init_s"], g["measure_s"])
    out["handling"] = diff(g["wall_s"], g["case_s"], g["close_s"])
    return out


def run_cost(run_dir: Path) -> dict:
    """{"ops": {op: {"member_rounds", "held_s", parts...}} and "all", summed over the run's ok rows;
    "wall_s" (wall_s.txt, None without it); "timeline" (below, None without session start times)}.
    FileNotFoundError names a run without measurements.csv."""
    run_dir = Path(run_dir)
    path = run_dir / "measurements.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no measurements.csv (the run has not collected its sessions)")
    groups: dict[str, dict] = {}
    with path.open() as f:
        for row in csv.DictReader(f):
            if row.get("status") != "ok" or not row.get("rounds"):
                continue
            for key in (row["op"], "all"):
                g = groups.setdefault(key, {"member_rounds": 0, "held_s": 0.0, **{n: 0.0 for n, _ in PARTS}})
                g["member_rounds"] += int(row["rounds"])
                g["held_s"] += _num(row.get("wall_s")) or 0.0
                for name, secs in row_parts(row).items():
                    g[name] = None if secs is None or g[name] is None else g[name] + secs
    wall = run_dir / "wall_s.txt"
    return {"run": str(run_dir), "ops": groups, "wall_s": float(wall.read_text().split()[0]) if wall.exists() else None,
            "timeline": timeline(run_dir)}


def session_kind(rel: Path) -> str:
    """sessions/<op>/tp<N>/<dim>/step<k> -> steps; sessions/<op>/tp<N>/point -> points;
    sessions/layer/tp<N> -> blocks."""
    parts = rel.parts
    if parts[0] == "layer":
        return "blocks"
    return "points" if parts[-1] == "point" else "steps"


def timeline(run_dir: Path) -> dict | None:
    """{"kinds": {kind: {"sessions", "s"}}, "steps_per_op": {op: step sessions}, "span_s", "busy_s", "idle_s",
    "gap_s" (median gap before a session on its GPUs, None with one session)}, or None for a run whose
    sessions record no start time."""
    run_dir = Path(run_dir)
    sessions = []
    for f in sorted((run_dir / "sessions").glob("**/session.json")):
        rec = json.loads(f.read_text())
        if rec.get("started") is None or rec.get("wall_s") is None:
            return None
        rel = f.parent.relative_to(run_dir / "sessions")
        ids = frozenset(map(str, (rec.get("held") or {}).get("ids") or ())) or None
        sessions.append((float(rec["started"]), float(rec["wall_s"]), session_kind(rel), rel.parts[0], ids))
    if not sessions:
        return None
    sessions.sort(key=lambda s: s[0])
    kinds = {k: {"sessions": 0, "s": 0.0} for k in KINDS}
    steps_per_op: dict[str, int] = {}
    for _, wall, kind, op, _ in sessions:
        kinds[kind]["sessions"] += 1
        kinds[kind]["s"] += wall
        if kind == "steps":
            steps_per_op[op] = steps_per_op.get(op, 0) + 1
    busy, end = 0.0, None        # the union of the sessions' intervals
    for start, wall, *_ in sessions:
        stop = start + wall
        if end is None or start >= end:
            busy += wall
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    gaps = []
    for i, (start, _, _, _, ids) in enumerate(sessions):
        ends = [s + w for s, w, _, _, other in sessions[:i]
                if s + w <= start + 1e-6 and (ids is None or other is None or ids & other)]
        if ends:
            gaps.append(start - max(ends))
    first = sessions[0][0]
    span = max(st + w for st, w, *_ in sessions) - first
    return {"kinds": kinds, "steps_per_op": steps_per_op, "span_s": span, "busy_s": busy, "idle_s": span - busy,
            "gap_s": statistics.median(gaps) if gaps else None}
