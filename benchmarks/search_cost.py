"""Search cost: the binary search against the exhaustive grid of the same space, for one op and TP.

    python benchmarks/search_cost.py --search outputs/<bisect run> --grid outputs/<grid or joint run> \
        --op qkv --tp 4

Both runs must have finished (decisions.json, search/<op>/tp<N>/point.json). Prints, for each run, the
cases measured for (op, TP), their device-seconds (GPUs held × TP size, start-up included) and the
winner; then where the search's winner ranks in the grid run (same process conditions) and whether
it is within the grid best's noise margin.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tptune.cases import parse_case_id  # noqa: E402
from tptune.search.noise import compare_points  # noqa: E402
from tptune.search.points import point_median  # noqa: E402


def measured(run_dir: Path, op: str, tp: int) -> dict[str, dict]:
    out = {}
    for p in sorted((run_dir / "cases" / op / f"tp{tp}").glob("*/run.json")):
        r = json.loads(p.read_text())
        out[r["case"]] = r
    return out


def device_seconds(runs: dict[str, dict], startup: bool = True) -> float:
    """GPU-seconds: time the case held its GPUs x TP size; without ``startup`` the worker-group
    start a case happened to pay is left out (it depends on scheduling, not on the search)."""
    total = 0.0
    for r in runs.values():
        launch = r.get("launch") or {}
        held = launch.get("held_s")
        if held is None:
            held = sum(a.get("held_s", 0.0) for a in r.get("attempts", []))
        if not startup and launch.get("server_started"):
            held -= launch.get("connect_s", 0.0) + max(0.0, launch.get("init_s", 0.0) - 1.0)
        total += max(held, 0.0) * r["tp"]
    return total


def summarize(run_dir: Path, op: str, tp: int) -> dict:
    runs = measured(run_dir, op, tp)
    point = json.loads((run_dir / "search" / op / f"tp{tp}" / "point.json").read_text())
    best = point["best"]
    return {"run": str(run_dir), "cases": len(runs), "device_s": device_seconds(runs), "tuned": point.get("tuned_case"),
            "measure_s": device_seconds(runs, startup=False),
            "best": best["case"] if best else None, "best_ms": point_median(best) if best else None,
            "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--search", required=True, type=Path)
    ap.add_argument("--grid", required=True, type=Path)
    ap.add_argument("--op", required=True)
    ap.add_argument("--tp", required=True, type=int)
    ap.add_argument("--floor", type=float, default=0.02)
    a = ap.parse_args(argv)
    s, g = summarize(a.search, a.op, a.tp), summarize(a.grid, a.op, a.tp)
    print(f"{'':8s} {'cases':>6s} {'GPU-s':>8s} {'GPU-s w/o start-up':>19s}  best")
    for name, r in (("search", s), ("grid", g)):
        print(f"{name:8s} {r['cases']:6d} {r['device_s']:8.1f} {r['measure_s']:19.1f}  {r['best']} ({r['best_ms']:.3f} ms)")
    ratio = s["measure_s"] / g["measure_s"] if g["measure_s"] else float("nan")
    print(f"search/grid GPU-seconds without start-up: {ratio:.0%} (with: "
          f"{s['device_s'] / g['device_s']:.0%}); cases {s['cases']}/{g['cases']} = {s['cases'] / g['cases']:.0%}")
    # the search's winner as measured inside the grid run (same processes, same conditions)
    grid_runs = g["runs"]
    key = parse_case_id(s["best"]).variant_id if s["best"] else None
    twin = next((r for cid, r in grid_runs.items() if key and parse_case_id(cid).variant_id == key), None)
    if twin is None:
        twin = next((r for cid, r in grid_runs.items()
                     if key and set(parse_case_id(cid).variant.overrides) == set(parse_case_id(s["best"]).variant.overrides)),
                    None)
    configs = [r for cid, r in grid_runs.items() if r["status"] == "ok" and not cid.endswith("-nocomm")]
    best_grid = min(configs, key=point_median)  # the bound is no config a user can pick
    if twin is not None:
        cmp = compare_points(twin, best_grid, floor=a.floor, tie="a")
        rank = sorted(point_median(r) for r in configs).index(point_median(twin)) + 1
        print(f"search winner in the grid run: {twin['case']} {point_median(twin):.3f} ms, rank {rank}/{len(configs)}; "
              f"grid best {best_grid['case']} {point_median(best_grid):.3f} ms; margin {cmp.margin:.1%}: "
              + ("within noise" if cmp.outcome <= 0 else "grid best is faster beyond noise"))
    else:
        cmp = compare_points({**s["runs"][s["best"]]}, best_grid, floor=a.floor, tie="a")
        print(f"search winner not in the grid run; across runs: {point_median(s['runs'][s['best']]):.3f} vs "
              f"{point_median(best_grid):.3f} ms, margin {cmp.margin:.1%}, outcome {cmp.outcome}")
    if s.get("tuned"):
        tuned_key = set(parse_case_id(s["tuned"]).variant.overrides)
        t = next((r for cid, r in grid_runs.items() if set(parse_case_id(cid).variant.overrides) == tuned_key
                  and parse_case_id(cid).variant.kind == "ub"), None)
        if t is not None:
            rank = sorted(point_median(r) for r in configs).index(point_median(t)) + 1
            print(f"search's tuned combination {s['tuned']}: in the grid run {point_median(t):.3f} ms, "
                  f"rank {rank}/{len(configs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
