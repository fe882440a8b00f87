"""Where a tuning run's time went, from its small files (measurements.csv, wall_s.txt when present).

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

With wall_s.txt (scripts/device_workflow.sh writes it) it also prints the run's wall time against the
sum of what its members held: the difference is Snakemake, the bookkeeping jobs, start-up and
analysis. A run recorded before these columns existed prints only what it has.

The session timeline (each sessions/**/session.json's ``started`` and ``wall_s``): the sessions per kind
(knob or bisection steps, TP points, blocks) and their seconds; the span from the first session's start
to the last one's end; the time inside it when no session ran (between sessions: Snakemake, the
checkpoint's decision, the next job's start); and, with wall_s.txt, what lies outside the span (start-up
before the first session, the jobs after the last). Sessions that ran at once (TP 2 sessions on the two
GPU pairs of a 4-GPU node) count once in the time busy.

  python benchmarks/run_cost.py outputs/<run> [results/<other run> ...]
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

PARTS = (("window", "timed_s"), ("hold", "hold_s"), ("warm-up etc.", None), ("build", "init_s"),
         ("teardown", "close_s"), ("evidence", None), ("handling", None))


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
    """{op: {"member_rounds", "held_s", parts...}} and "all", summed over the run's ok rows."""
    path = run_dir / "measurements.csv"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no measurements.csv (the run has not collected its sessions)")
    groups: dict[str, dict] = {}
    for row in csv.DictReader(path.open()):
        if row.get("status") != "ok" or not row.get("rounds"):
            continue
        for key in (row["op"], "all"):
            g = groups.setdefault(key, {"member_rounds": 0, "held_s": 0.0, **{n: 0.0 for n, _ in PARTS}})
            g["member_rounds"] += int(row["rounds"])
            g["held_s"] += _num(row.get("wall_s")) or 0.0
            for name, secs in row_parts(row).items():
                g[name] = None if secs is None or g[name] is None else g[name] + secs
    wall = run_dir / "wall_s.txt"
    return {"run": str(run_dir), "ops": groups, "wall_s": float(wall.read_text()) if wall.exists() else None,
            "timeline": timeline(run_dir)}


KINDS = ("steps", "points", "blocks")


def session_kind(rel: Path) -> str:
    """sessions/<op>/tp<N>/<dim>/step<k> -> steps; sessions/<op>/tp<N>/point -> points;
    sessions/layer/tp<N> -> blocks."""
    parts = rel.parts
    if parts[0] == "layer":
        return "blocks"
    return "points" if parts[-1] == "point" else "steps"


def timeline(run_dir: Path) -> dict | None:
    """The session timeline (module doc), or None for a run whose sessions record no start time."""
    sessions = []
    for f in sorted((run_dir / "sessions").glob("**/session.json")):
        rec = json.loads(f.read_text())
        if rec.get("started") is None or rec.get("wall_s") is None:
            return None
        sessions.append((float(rec["started"]), float(rec["wall_s"]),
                         session_kind(f.parent.relative_to(run_dir / "sessions"))))
    if not sessions:
        return None
    kinds = {k: {"sessions": 0, "s": 0.0} for k in KINDS}
    for _, wall, kind in sessions:
        kinds[kind]["sessions"] += 1
        kinds[kind]["s"] += wall
    busy, end = 0.0, None        # the union of the sessions' intervals
    for start, wall, _ in sorted(sessions):
        stop = start + wall
        if end is None or start >= end:
            busy += wall
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    first = min(st for st, _, _ in sessions)
    span = max(st + w for st, w, _ in sessions) - first
    return {"kinds": kinds, "span_s": span, "busy_s": busy, "idle_s": span - busy}


def print_cost(res: dict) -> None:
    print(res["run"])
    names = [n for n, _ in PARTS]
    print(f"  {'op':5} {'member-rounds':>13} {'held s':>8} {'s/mr':>6} " + " ".join(f"{n:>12}" for n in names))
    for op, g in sorted(res["ops"].items(), key=lambda kv: (kv[0] == "all", kv[0])):
        n = g["member_rounds"]
        cells = " ".join(f"{g[k] / n:12.3f}" if g[k] is not None else f"{'-':>12}" for k in names)
        print(f"  {op:5} {n:13d} {g['held_s']:8.1f} {g['held_s'] / n:6.3f} {cells}")
    if res["wall_s"] is not None and "all" in res["ops"]:
        held = res["ops"]["all"]["held_s"]
        print(f"  run wall time {res['wall_s']:.0f} s, members held {held:.1f} s, the rest {res['wall_s'] - held:.1f} s "
              f"(Snakemake, bookkeeping jobs, start-up, analysis)")
    tl = res.get("timeline")
    if tl:
        kinds = ", ".join(f"{k} {v['sessions']} ({v['s']:.1f} s)" for k, v in tl["kinds"].items() if v["sessions"])
        print(f"  sessions: {kinds}; span {tl['span_s']:.1f} s, of which no session ran {tl['idle_s']:.1f} s")
        if res["wall_s"] is not None:
            print(f"  outside the sessions' span (start-up, the jobs after the last session): "
                  f"{res['wall_s'] - tl['span_s']:.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run folders holding measurements.csv")
    a = ap.parse_args(argv)
    for run in a.runs:
        try:
            res = run_cost(run)
        except FileNotFoundError as e:
            print(e, file=sys.stderr)
            return 2
        if not res["ops"]:
            print(f"{run}: no measured member in measurements.csv", file=sys.stderr)
            return 2
        print_cost(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
