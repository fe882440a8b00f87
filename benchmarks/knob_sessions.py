"""How many sessions the knob search (search.mode: knobs) of a run config needs per op, before any GPU:
the planner stepped over synthetic measurements where nothing moves (every setting ties, so each
group is frozen at its cheapest value and each bisection walks to its cheapest end) and, with
--moving, where the row ops' pipelined fprop wins and num_sm / num_splits have an interior optimum.

    python benchmarks/knob_sessions.py config/gpu/h200x2-llama3-70b-knobs.yaml [--moving]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tptune.search import knob_search  # noqa: E402
from tptune.cases import parse_case_id  # noqa: E402
from tptune.search.knobs import plan_result  # noqa: E402
from tptune.te.methods import grid_size  # noqa: E402
from tptune.te.ubcfg import case_ub_cfgs  # noqa: E402
from tptune.measure.preflight import resolve_here  # noqa: E402
from tptune.settings.resolve import load_config_files  # noqa: E402

ROUNDS = [1.0, 1.004, 0.998, 1.001]             # one drift shared by a session's members


def flat(op: str, cfgs: dict) -> float:
    return 10.0


def moving(op: str, cfgs: dict) -> float:
    t = 10.0
    for name, e in cfgs.items():
        if name.startswith(op + "_") and e["method"] in ("pipeline", "bulk"):
            t += 0.3 * abs(math.log2(e.get("num_sm", 16)) - 3) - (1.0 if e["method"] == "pipeline" else 0.0)
            t += 0.3 * abs(math.log2(e.get("num_splits", 4)) - 2) if e["method"] == "pipeline" else 0.0
    return t


def count(s, op: str, tp: int, model) -> tuple:
    plan = knob_search.planner_args(s, op, tp)
    _, measured = knob_search.walk(
        s, op, tp, lambda cid: model(op, case_ub_cfgs(parse_case_id(cid), workload=plan["workload"])), ROUNDS)
    res = plan_result(op, tp, measured=measured, **plan)
    grid = grid_size(op, tp, plan["references"][res.reference], plan["config"], plan["workload"])
    return res, grid


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configfile", nargs="+", help="run config(s) merged over config/config.yaml")
    ap.add_argument("--moving", action="store_true", help="the landscape where pipeline and num_sm 8 win")
    a = ap.parse_args(argv)
    cfg = load_config_files(ROOT / "config" / "config.yaml", *a.configfile)
    s = resolve_here(cfg, base_dir=ROOT, check_hardware=False)
    model = moving if a.moving else flat
    for tp in s.tp_sizes:
        total_s = total_m = 0
        for op in s.ops:
            res, grid = count(s, op, tp, model)
            sizes = [len(x.members) for x in res.sessions]
            total_s, total_m = total_s + len(sizes), total_m + sum(sizes)
            print(f"TP={tp} {op:5s} {len(sizes):3d} sessions, {sum(sizes):3d} settings (largest session "
                  f"{max(sizes)}), grid {grid} settings")
        print(f"TP={tp} all ops: {total_s} sessions, {total_m} settings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
