"""Where a tuning run's time went, from its small files (measurements.csv, wall_s.txt when present); the
computation is tptune.records.run_cost (``tptune figures`` quotes it through its ``run_cost`` kind).

What each column is: tptune.records.run_cost's docstring.

With wall_s.txt (scripts/device_workflow.sh writes it) it also prints the run's wall time against the
sum of what its members held: the difference is Snakemake, the bookkeeping jobs, start-up and
analysis. A run recorded before these columns existed prints only what it has.

The session timeline (each sessions/**/session.json's ``started`` and ``wall_s``): the sessions per kind
(knob or bisection steps, TP points, blocks) and their seconds; the span from the first session's start
to the last one's end; the time inside it when no session ran (between sessions: Snakemake, the
checkpoint's decision, the next job's start); the median gap before a session on its GPUs; and, with wall_s.txt, what lies outside the span (start-up
before the first session, the jobs after the last). Sessions that ran at once (TP 2 sessions on the two
GPU pairs of a 4-GPU node) count once in the time busy.

  python benchmarks/run_cost.py outputs/<run> [results/<other run> ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tptune.records.run_cost import KINDS, PARTS, row_parts, run_cost, session_kind, timeline  # noqa: F401


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
        if tl["gap_s"] is not None:
            print(f"  median gap before a session on its GPUs: {tl['gap_s']:.1f} s")
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
