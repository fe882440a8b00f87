"""The fit a wall-time prediction costs sessions with before anything is measured (tptune plan's
wall_predicted.json), from the committed runs: seconds per member-round per session kind and TP, the
share of the round budget sessions use, the worker-group start, the bookkeeping between sessions and the
time outside them (tptune.schedule.wall_fit says what each is). Then, for each fitted run against its
wall_s.txt (tptune.schedule.accuracy): its own sessions replayed on its own node (tptune predict, given the
run's own start-up, held times and gaps: a regression test of the scheduler), the prediction before measuring
from its config alone (tptune plan: the accuracy a user gets), and where it measured TP 2 + 4 the factors its
8-GPU extrapolation scales TP 4's sessions by.

    python benchmarks/wall_fit.py [results] [--write]     # --write: src/tptune/data/wall_fit.json and
                                                           # results/wall_replay.json (docs/wall-time.md quotes it)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tptune.schedule.accuracy import DEFAULT_ROUNDS, run_figures  # noqa: E402
from tptune.schedule.wall_fit import TABLE, fit  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="?", type=Path, default=ROOT / "results")
    ap.add_argument("--write", action="store_true", help=f"write src/tptune/data/{TABLE}")
    a = ap.parse_args(argv)
    table = fit(a.results)
    print(f"fitted {len(table['runs'])} runs, {table['sessions']} sessions; left out:")
    for line in table["left_out"]:
        print(f"  {line}")
    print(f"group start {table['group_start_s']:.1f} s; outside the sessions' span {table['outside_s']:.1f} s")
    print("bookkeeping waits (s): " + ", ".join(f"{k} {v:.1f}" for k, v in table["gaps_s"].items()))
    for kind, per_tp in table["member_round_s"].items():
        print(f"{kind:6s} s per member-round: " + ", ".join(f"TP {t} {v:.3f}" for t, v in per_tp.items())
              + f"; rounds used {table['rounds_share'].get(kind, 0):.0%} of the budget")
    print(f"  {'run':48s} {'wall s':>6} {'replayed':>9} {'':>7} {'before':>7} {'':>6}")
    figs = run_figures(a.results, table, ROOT)
    for b in figs["before_measuring"]:
        r, wall = figs["runs"][b["run"]], b["wall_s"]
        print(f"  {b['run']:48s} {wall:6.0f} {r['replayed_s']:9.1f} {r['replayed_s'] / wall - 1:+7.1%} "
              f"{b['before_s']:7.0f} {b['before_s'] / wall - 1:+6.0%}")
    errors = sorted(abs(b["before_s"] / b["wall_s"] - 1) for b in figs["before_measuring"])
    default_errors = sorted(abs(b["before_s"] / b["wall_s"] - 1) for b in figs["before_measuring"] if b["defaults"])
    print(f"  replayed on its own node (its own start-up, held times and gaps: a check of the scheduler): largest "
          f"error {max(abs(r['replayed_s'] / r['wall_s'] - 1) for r in figs['runs'].values()):.1%}")
    print(f"  before measuring: median error {errors[len(errors) // 2]:.0%}, largest {errors[-1]:.0%}")
    # the older runs' budgets (up to 6 rounds, every knob group, bisection) plan more steps where nothing moves
    # than their searches took; the te defaults' budget is what a new run gets
    if default_errors:
        print(f"  before measuring, the runs with the te defaults' search and budget (knob search, "
              f"{DEFAULT_ROUNDS[0]}-{DEFAULT_ROUNDS[1]} rounds; {len(default_errors)} runs): median error "
              f"{default_errors[len(default_errors) // 2]:.0%}, largest {default_errors[-1]:.0%}")
    for run, r in figs["tp8"].items():
        print(f"  8 GPUs, TP 8 extrapolated: {run}: TP 4's sessions scaled by {r['lo']:.2f} to {r['hi']:.2f}")
    if a.write:
        out = ROOT / "src" / "tptune" / "data" / TABLE
        out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {out}")
        out = a.results / "wall_replay.json"
        out.write_text(json.dumps({"about": "benchmarks/wall_fit.py (tptune.schedule.accuracy): each fitted run's wall_s.txt "
                                            "beside its own sessions replayed on its own node (tptune predict: a check of "
                                            "the scheduler), the prediction before measuring (tptune plan: before_s; "
                                            "defaults: made with the te defaults' search and budget), and where TP 8 is "
                                            "extrapolated on 8 GPUs the factors TP 4's sessions are scaled by (tp8)",
                                   **figs}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
