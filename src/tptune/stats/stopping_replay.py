"""The futility stop (timing.futility) replayed on recorded sessions: each session's stopping rules
(stats.rounds: session_state, should_stop, measured_next, as measure.launch.Launcher.session runs them) over
its members' recorded per-round values, once without the futility stop and once with it: what each measured
(member-rounds) and every comparison whose outcome differs (resolved or not, and its side).
benchmarks/replay_stopping.py prints it; the ``stopping_replay`` figure kind quotes it.

A replay can only take values the recording has; a member a replay asks for in a round it was not measured in
(an older harness dropped the references, or a replay that stops later) sits that round out (``gaps``).
"""
from __future__ import annotations

from pathlib import Path

from tptune.cases import REFERENCE_KINDS, parse_case_id
from tptune.records.measured_point import MeasuredPoint, TimingSummary
from tptune.records.sessions import load_session
from tptune.stats.rounds import measured_next, point_rounds, rotation, session_state, should_stop

CHANGES = ("side -> undecided", "tie -> undecided", "undecided -> cleared", "other")


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



def replay_sessions(session_dirs) -> dict:
    """Both replays of every session folder in ``session_dirs`` with two or more recorded members, and their
    totals: sessions, exact (those whose replay without the stop takes their recorded rounds, no gaps),
    member_rounds {off, on}, saved (1 - on / off), compared (comparisons with the leader), changes (per kind
    of CHANGES), leader_changed, and per session its folder, off and on."""
    out = {"sessions": 0, "exact": 0, "member_rounds": {"off": 0, "on": 0}, "compared": 0,
           "changes": dict.fromkeys(CHANGES, 0), "leader_changed": 0, "per_session": []}
    for sdir in session_dirs:
        rec, vals = recorded_rounds(sdir)
        if len(vals) < 2:
            continue
        off, on = replay(rec, vals, False), replay(rec, vals, True)
        out["sessions"] += 1
        out["exact"] += off["rounds"] == rec["rounds"] and off["gaps"] == 0
        out["member_rounds"]["off"] += off["member_rounds"]
        out["member_rounds"]["on"] += on["member_rounds"]
        out["compared"] += len(off["outcomes"])
        out["leader_changed"] += off["leader"] != on["leader"]
        for c, x in off["outcomes"].items():
            if x != on["outcomes"].get(c):
                out["changes"][change_kind(x, on["outcomes"].get(c))] += 1
        out["per_session"].append({"session": sdir, "off": off, "on": on})
    mr = out["member_rounds"]
    out["saved"] = 1 - mr["on"] / mr["off"] if mr["off"] else 0.0
    return out
