"""Search cost: the binary search against the exhaustive grid of the same space, for one op and TP.

    python benchmarks/search_cost.py --search outputs/<bisect run> --grid outputs/<grid or joint run> \
        --op qkv --tp 4

Both runs must have finished. Prints, for each run, the settings its search sessions measured for
(op, TP), the setting-rounds and the GPU-seconds of those sessions (GPUs held x TP, canary and start-up
included), and the winner; then where the search's winner ranks inside the grid's session (measured
side by side with every candidate) and whether the grid best beats it beyond the noise.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tptune.cases import parse_case_id  # noqa: E402
from tptune.stats.noise import compare_points  # noqa: E402
from tptune.records.measured_point import MeasuredPoint  # noqa: E402
from tptune.records.run_dir import SESSION_JSON, RunDir  # noqa: E402
from tptune.records.sessions import read_point  # noqa: E402


def _sessions(run_dir: Path, op: str, tp: int) -> list[tuple[Path, dict]]:
    tp_sessions = RunDir(run_dir).point_session(op, tp).parent      # sessions/<op>/tp<N>: its steps and its point
    return [(p, json.loads(p.read_text())) for p in sorted(tp_sessions.glob(f"**/{SESSION_JSON}"))]


def measured(run_dir: Path, op: str, tp: int, search_only: bool = True) -> dict[str, MeasuredPoint]:
    """Every setting the searches of (op, TP) measured, from their sessions (the TP point left out
    unless ``search_only`` is false); a setting measured in several sessions appears once, last."""
    out = {}
    for p, sess in _sessions(run_dir, op, tp):
        if search_only and p.parent.name == "point":
            continue
        for cid, rel in sess["runs"].items():
            out[cid] = read_point(p.parent / rel)
    return out


def summarize(run_dir: Path, op: str, tp: int) -> dict:
    sess = [(p, x) for p, x in _sessions(run_dir, op, tp) if p.parent.name != "point"]
    if not sess:
        raise SystemExit(f"search_cost.py: {RunDir(run_dir).point_session(op, tp).parent}: no search session of "
                         f"{op} at TP {tp} (a run recorded before sessions, e.g. results/legacy, has none to count)")
    runs = measured(run_dir, op, tp)
    point = json.loads(RunDir(run_dir).tp_point(op, tp).read_text())
    best = next((c for c in runs if point.get("searches") and
                 any(v.get("best_case") == c for v in point["searches"].values())), None)
    return {"run": str(run_dir), "cases": len(runs), "sessions": len(sess),
            "measurements": sum(sum(len(o) for o in x["order"]) for _, x in sess),
            "device_s": sum(x.get("gpu_s") or 0.0 for _, x in sess),
            "best": best, "best_ms": runs[best].median() if best else None, "runs": runs,
            "grid_sessions": [x for _, x in sess]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--search", required=True, type=Path)
    ap.add_argument("--grid", required=True, type=Path)
    ap.add_argument("--op", required=True)
    ap.add_argument("--tp", required=True, type=int)
    ap.add_argument("--floor", type=float, default=0.02)
    a = ap.parse_args(argv)
    s, g = summarize(a.search, a.op, a.tp), summarize(a.grid, a.op, a.tp)
    print(f"{'':8s} {'settings':>8s} {'sessions':>8s} {'setting-rounds':>14s} {'GPU-s':>8s}  best")
    for name, r in (("search", s), ("grid", g)):
        print(f"{name:8s} {r['cases']:8d} {r['sessions']:8d} {r['measurements']:14d} {r['device_s']:8.1f}  "
              f"{r['best']} ({r['best_ms']:.3f} ms)")
    print(f"search/grid GPU-seconds: {s['device_s'] / g['device_s']:.0%}; setting-rounds "
          f"{s['measurements']}/{g['measurements']} = {s['measurements'] / g['measurements']:.0%}")
    # the search's winner inside the grid's session (side by side with every other candidate)
    grid_runs = g["runs"]
    key = parse_case_id(s["best"]).variant_id if s["best"] else None
    twin = next((r for cid, r in grid_runs.items() if key and parse_case_id(cid).variant_id == key), None)
    configs = [r for cid, r in grid_runs.items() if r.status == "ok"]
    best_grid = min(configs, key=MeasuredPoint.median)
    if twin is not None:
        cmp = compare_points(twin, best_grid, floor=a.floor, tie="a")
        rank = sorted(r.median() for r in configs).index(twin.median()) + 1
        ratio = cmp.ratio.to_dict() if cmp.ratio else {}
        print(f"search winner in the grid session: {twin.case} {twin.median():.3f} ms, rank {rank}/{len(configs)}; "
              f"grid best {best_grid.case} {best_grid.median():.3f} ms; ratio {ratio.get('ratio')} "
              f"[{ratio.get('lo')}, {ratio.get('hi')}]: "
              + ("within noise" if cmp.outcome <= 0 else "grid best is faster beyond noise"))
    else:
        print(f"search winner {s['best']} not in the grid session")
    return 0


if __name__ == "__main__":
    sys.exit(main())
