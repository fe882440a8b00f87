"""What the futility stop (timing.futility) saves and changes, replayed on recorded GPU sessions.

Every session folder under the given paths (session.json and its members' run.json, as the tuning
harness writes them) holds each member's per-round values. This replays the session's stopping
rules (search.rounds: session_state, should_stop, measured_next, as launch.Launcher.session runs
them) over those values, once without the futility stop and once with it, and prints what each
measured (member-rounds) and every comparison whose outcome differs (resolved or not, and its side).

A replay can only take values the recording has; a member a replay asks for in a round it was not
measured in (an older harness dropped the references, or a replay that stops later) sits that round
out, and the line says how many such gaps the replay met.

  python benchmarks/replay_stopping.py [results/...] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from tptune.cases import REFERENCE_KINDS, parse_case_id  # noqa: E402
from tptune.stats.rounds import measured_next, point_rounds, rotation, session_state, should_stop  # noqa: E402
from tptune.records.measured_point import MeasuredPoint, TimingSummary  # noqa: E402
from tptune.records.sessions import load_session  # noqa: E402


def recorded_rounds(session_dir: Path) -> tuple[dict, dict[str, dict[int, float]]]:
    """(session.json, {member: {round id: value}}) of a recorded session (failed members left out)."""
    recorded = load_session(session_dir)
    rec, runs = recorded.record, recorded.points
    vals = {cid: point_rounds(run) for cid, run in runs.items()}
    return rec, {cid: v for cid, v in vals.items() if v}


def replay(rec: dict, vals: dict[str, dict[int, float]], futility: bool) -> dict:
    """The session's adaptive rounds over the recorded values (module doc)."""
    members = [m for m in rec["members"] if m in vals]
    contenders = [c for c in rec["contenders"] if c in vals]
    margin, tie = rec["margin"], rec.get("tie_margin")
    min_r, max_r = rec["min_rounds"], rec["max_rounds"]
    references = {m for m in members if parse_case_id(m).variant.kind in REFERENCE_KINDS}
    got: dict[str, dict[int, float]] = {m: {} for m in members}
    active, r, measured, gaps, why = list(members), 0, 0, 0, ""
    state = session_state({}, contenders, margin, tie_margin=tie)
    while active:
        for c in rotation(active, r):
            if r in vals[c]:
                got[c][r] = vals[c][r]
                measured += 1
            else:
                gaps += 1
        r += 1
        points = {c: MeasuredPoint(c, "ok", rec["session"],
                                   timing={"total_ms": TimingSummary(rounds=tuple(v.values()), round_ids=tuple(v))})
                  for c, v in got.items() if v}
        state = session_state(points, contenders, margin, leader_among=active, tie_margin=tie,
                              budget=max_r if futility else None)
        stop, why = should_stop(state, r, min_r, max_r)
        if stop:
            break
        if r >= min_r:
            active = measured_next(state, active, references, rec.get("always") or ())
    outcomes = {c: (state.resolved.get(c), x.outcome(margin, tie)[0] if x else None)
                for c, x in state.ratios.items()}
    return {"rounds": r, "member_rounds": measured, "gaps": gaps, "leader": state.leader, "stop": why,
            "outcomes": outcomes}


def change_kind(off: tuple | None, on: tuple | None) -> str:
    """How a comparison's (resolved, side) without the futility stop became what it is with it."""
    if off and on and off[0] and not on[0]:
        return "side -> undecided" if off[1] else "tie -> undecided"
    if off and on and not off[0] and on[0]:
        return "undecided -> cleared"
    return "other"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", default=[str(ROOT / "results")], help="folders searched for session.json")
    ap.add_argument("--json", help="write every session's two replays here")
    a = ap.parse_args(argv)
    sessions = sorted({p.parent for root in a.paths for p in Path(root).rglob("session.json")})
    total = {False: 0, True: 0}
    exact = changed = 0
    kinds = {"side -> undecided": 0, "tie -> undecided": 0, "undecided -> cleared": 0, "other": 0}
    compared = 0
    out = []
    for sdir in sessions:
        rec, vals = recorded_rounds(sdir)
        if len(vals) < 2:
            continue
        off, on = replay(rec, vals, False), replay(rec, vals, True)
        exact += off["rounds"] == rec["rounds"] and off["gaps"] == 0
        total[False] += off["member_rounds"]
        total[True] += on["member_rounds"]
        diff = {c: (off["outcomes"][c], on["outcomes"].get(c)) for c in off["outcomes"]
                if off["outcomes"][c] != on["outcomes"].get(c)}
        changed += off["leader"] != on["leader"]
        compared += len(off["outcomes"])
        for x, y in diff.values():
            kinds[change_kind(x, y)] += 1
        out.append({"session": str(sdir), "off": off, "on": on})
        if off["rounds"] != on["rounds"] or diff:
            print(f"{sdir}: rounds {off['rounds']} -> {on['rounds']}, member-rounds {off['member_rounds']} -> "
                  f"{on['member_rounds']}" + (f", leader {off['leader']} -> {on['leader']}"
                                              if off["leader"] != on["leader"] else ""))
            for c, (x, y) in diff.items():
                print(f"    {c}: (resolved, side) {x} -> {y}")
    n = len(out)
    saved = 1 - total[True] / total[False] if total[False] else 0.0
    print(f"{n} sessions ({exact} replay their recorded rounds exactly without the futility stop): member-rounds "
          f"{total[False]} without, {total[True]} with the futility stop ({saved:.1%} fewer); of {compared} "
          f"comparisons with the leader, {sum(kinds.values())} end otherwise: "
          + ", ".join(f"{k} {v}" for k, v in kinds.items())
          + f"; the session's leader (the fastest centre, not the pick) changed in {changed}")
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
