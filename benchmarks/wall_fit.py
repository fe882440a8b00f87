"""The fit a wall-time prediction costs sessions with before anything is measured (tptune plan's
wall_predicted.json), from the committed runs: seconds per member-round per session kind and TP, the
share of the round budget sessions use, the worker-group start, the bookkeeping between sessions and the
time outside them (tptune.schedule.wall_fit says what each is). Then, for each fitted run against its
wall_s.txt: its own sessions replayed on its own node (tptune predict, schedule.replay), and the
prediction before measuring from its config alone (tptune plan, schedule.plan_estimate).

    python benchmarks/wall_fit.py [results] [--write]     # --write: src/tptune/data/wall_fit.json and
                                                           # results/wall_replay.json (each run replayed, docs/wall-time.md)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tptune.measure.preflight import resolve_here  # noqa: E402
from tptune.schedule.plan_estimate import estimate  # noqa: E402
from tptune.schedule.replay import predict  # noqa: E402
from tptune.settings.resolve import load_run_config  # noqa: E402
from tptune.schedule.wall_fit import TABLE, fit, fitted_runs  # noqa: E402
from tptune.settings.backend_defaults import BY_BACKEND  # noqa: E402


DEFAULT_ROUNDS = (BY_BACKEND[("timing", "min_rounds")]["te"], 4)


def is_default_budget(s) -> bool:
    """A te run measured with the defaults' search and round budget (settings.backend_defaults)."""
    return (s.backend == "te" and s.search.mode == BY_BACKEND[("search", "mode")]["te"]
            and (s.timing.min_rounds, s.timing.max_rounds) == DEFAULT_ROUNDS)


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
    errors, default_errors, replayed = [], [], {}
    for run, _, wall in fitted_runs(a.results)[0]:
        p = predict(run, table=table)
        replayed[run.root.relative_to(a.results).as_posix()] = {"wall_s": wall, "replayed_s": round(p.predicted_wall_s, 3)}
        cfg, source, _ = load_run_config([run.config_json])
        s = resolve_here(cfg, source=source, base_dir=ROOT, check_hardware=False)
        e = estimate(s, table=table)
        errors.append(abs(e.predicted_wall_s / wall - 1))
        if is_default_budget(s):
            default_errors.append(errors[-1])
        print(f"  {run.root.relative_to(a.results).as_posix():48s} {wall:6.0f} {p.predicted_wall_s:9.1f} "
              f"{p.predicted_wall_s / wall - 1:+7.1%} {e.predicted_wall_s:7.0f} {e.predicted_wall_s / wall - 1:+6.0%}")
    errors.sort()
    default_errors.sort()
    print(f"  before measuring: median error {errors[len(errors) // 2]:.0%}, largest {errors[-1]:.0%}")
    # the older runs' budgets (up to 6 rounds, every knob group, bisection) plan more steps where nothing moves
    # than their searches took; the te defaults' budget is what a new run gets
    if default_errors:
        print(f"  before measuring, the runs with the te defaults' search and budget (knob search, "
              f"{DEFAULT_ROUNDS[0]}-{DEFAULT_ROUNDS[1]} rounds; {len(default_errors)} runs): median error "
              f"{default_errors[len(default_errors) // 2]:.0%}, largest {default_errors[-1]:.0%}")
    if a.write:
        out = ROOT / "src" / "tptune" / "data" / TABLE
        out.write_text(json.dumps(table, indent=1) + "\n")
        print(f"wrote {out}")
        out = a.results / "wall_replay.json"
        out.write_text(json.dumps({"about": "benchmarks/wall_fit.py: each fitted run's own sessions replayed on its own node "
                                            "(tptune predict) beside its wall_s.txt", "runs": replayed}, indent=1) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
