"""What the futility stop (timing.futility) saves and changes, replayed on recorded GPU sessions
(stats.stopping_replay: each session's stopping rules over its members' recorded per-round values, once
without the futility stop and once with it). Prints every session whose rounds or outcomes differ, and the
totals.

  python benchmarks/replay_stopping.py [results/...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tptune.stats.stopping_replay import replay_sessions  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", default=[str(ROOT / "results")], help="folders searched for session.json")
    ap.add_argument("--json", help="write every session's two replays here")
    a = ap.parse_args(argv)
    sessions = sorted({p.parent for root in a.paths for p in Path(root).rglob("session.json")})
    r = replay_sessions(sessions)
    for s in r["per_session"]:
        off, on = s["off"], s["on"]
        diff = {c: (x, on["outcomes"].get(c)) for c, x in off["outcomes"].items() if x != on["outcomes"].get(c)}
        if off["rounds"] != on["rounds"] or diff:
            print(f"{s['session']}: rounds {off['rounds']} -> {on['rounds']}, member-rounds {off['member_rounds']} -> "
                  f"{on['member_rounds']}" + (f", leader {off['leader']} -> {on['leader']}"
                                              if off["leader"] != on["leader"] else ""))
            for c, (x, y) in diff.items():
                print(f"    {c}: (resolved, side) {x} -> {y}")
    mr = r["member_rounds"]
    print(f"{r['sessions']} sessions ({r['exact']} replay their recorded rounds exactly without the futility stop): "
          f"member-rounds {mr['off']} without, {mr['on']} with the futility stop ({r['saved']:.1%} fewer); of "
          f"{r['compared']} comparisons with the leader, {sum(r['changes'].values())} end otherwise: "
          + ", ".join(f"{k} {v}" for k, v in r["changes"].items())
          + f"; the session's leader (the fastest centre, not the pick) changed in {r['leader_changed']}")
    if a.json:
        Path(a.json).write_text(json.dumps(r["per_session"], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
