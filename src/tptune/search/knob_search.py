"""``search.mode: knobs``: the freeze-or-bisect knob planner (search/knobs.py) driven by the
workflow's checkpoints.

Each (op, TP) has one dimension, ``knobs``, whose values are case ids (each reproduces its ub_cfgs,
ubcfg.case_ub_cfgs). Step 0 measures the planner's first session (the references: TE defaults, then
each preset of ``search.te_presets``); every checkpoint step records its session (label and member
case ids), rebuilds the planner's measurements from all sessions so far and asks it for the next
session. When none is left, the record carries the planner's result, the cost of the search against
the exhaustive grid of the same knobs, and which knob groups were changed or frozen.
"""
from __future__ import annotations

import math
from pathlib import Path

from tptune.cases import make_case, parse_case_id
from tptune.records.measured_point import MeasuredPoint
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.search.knobs import Session, plan_next, plan_result
from tptune.settings.resolve import Settings
from tptune.stats.noise import compare_points
from tptune.stats.rounds import center
from tptune.te.methods import grid_size
from tptune.te.ubcfg import case_ub_cfgs, distinct_settings, op_entries

DIM = "knobs"


def references(s: Settings, op: str, tp: int) -> dict[str, dict]:
    """Full ub_cfgs of TE's defaults, then of each preset of ``search.te_presets`` (cheapest, most
    default first). A preset whose ``<op>_*`` entries equal an earlier reference's is left out, so
    the earlier name stands for that setting."""
    wl = s.model.workload.ub_rules
    cases = [make_case(op, tp, f"ub.{name}") for name in ["te", *s.op(op).search.te_presets]]
    return {c.variant.preset: case_ub_cfgs(c, workload=wl) for c in distinct_settings(cases, wl)}


def planner_args(s: Settings, op: str, tp: int) -> dict:
    """Keyword arguments of knobs.plan_next/plan_result for (op, TP) of this run."""
    win, floor = s.decision.step_margins
    return {"references": references(s, op, tp), "config": s.op(op).search.knobs,
            "workload": s.model.workload.ub_rules, "floor": floor, "win": win}


def synthetic_point(case: str, ms: float, rounds) -> MeasuredPoint:
    """A measured point of ``case`` at ``ms`` a round times each of ``rounds`` (one drift shared by a
    session's members), for stepping the search without measuring."""
    return MeasuredPoint.from_dict({"case": case, "status": "ok", "timing": {"total_ms": {
        "median": ms, "rounds": [ms * f for f in rounds], "round_ids": list(range(len(rounds)))}}})


def walk(s: Settings, op: str, tp: int, time_of, rounds, max_steps: int | None = None) -> tuple[list[int], dict]:
    """The knob search of (op, TP) stepped over synthetic measurements (``time_of(case_id)`` ms; no GPU):
    the members of each session it plans, at most ``max_steps``, and what the planner measured."""
    plan = planner_args(s, op, tp)
    measured, sizes = {}, []
    while (max_steps is None or len(sizes) < max_steps) and (
            sess := plan_next(op, tp, measured=measured, **plan)) is not None:
        measured[sess.label] = {c: synthetic_point(c, time_of(c), rounds) for c in sess.members}
        sizes.append(len(sess.members))
    return sizes, measured


def first_session(s: Settings, op: str, tp: int) -> Session:
    return plan_next(op, tp, measured={}, **planner_args(s, op, tp))


def step_record(s: Settings, op: str, tp: int, step: int, prev: dict | None, run_dir: Path) -> dict:
    """One checkpoint step of the knob search (the record shape of search.steps.step_record, plus
    ``label``/``next_label`` per session and, when done, ``reference``, ``cost`` and ``changes``)."""
    plan = planner_args(s, op, tp)
    first = plan_next(op, tp, measured={}, **plan)
    sessions = list(prev["sessions"]) if prev else []
    label, values = (prev["next_label"], list(prev["next"])) if prev else (first.label, list(first.members))
    rel = str(RunDir(".").step_session(op, tp, DIM, step))
    sessions.append({"step": step, "label": label, "values": values, "session": rel})
    measured, gpu_s = {}, 0.0
    for entry in sessions:
        recorded = load_session(Path(run_dir) / entry["session"])
        sess, runs = recorded.record, recorded.points
        missing = [v for v in entry["values"] if v not in runs]
        if missing:
            raise ValueError(f"{entry['session']}: session.json lacks {', '.join(missing)}")
        measured[entry["label"]] = {v: runs[v] for v in entry["values"]}
        gpu_s += float(sess.get("gpu_s") or 0.0)
    nxt = plan_next(op, tp, measured=measured, **plan)
    rec = {"op": op, "tp": tp, "dim": DIM, "step": step, "mode": "knobs",
           "candidates": list(first.members),
           "asked": [v for e in sessions for v in e["values"]], "sessions": sessions,
           "next": list(nxt.members) if nxt else [], "next_label": nxt.label if nxt else None,
           "next_cases": list(nxt.members) if nxt else [],
           "measured": {lab: {c: p.search_summary() for c, p in pts.items()} for lab, pts in measured.items()},
           "done": nxt is None}
    if nxt is None:
        res = plan_result(op, tp, measured=measured, **plan)
        rec.update({"best": res.case, "best_case": res.case, "path": res.path, "reference": res.reference,
                    "alternative": res.alternative,
                    "cost": cost(op, tp, plan["references"][res.reference], sessions, gpu_s, plan["workload"],
                                 plan["config"]),
                    "changes": changes(res.path, measured, plan["workload"], plan["floor"])})
    return rec


def cost(op: str, tp: int, base: dict, sessions: list[dict], gpu_s: float, workload: str,
         config: dict | None) -> dict:
    """GPU-seconds the search spent against the exhaustive grid of the same knob values over the best
    reference (methods.grid_size), estimated at this search's mean GPU-seconds per measured setting."""
    n = sum(len(e["values"]) for e in sessions)
    grid = grid_size(op, tp, base, config, workload)
    grid_s = grid * gpu_s / n if n else None
    return {"measurements": n, "sessions": len(sessions), "gpu_s": gpu_s, "grid_size": grid,
            "grid_gpu_s_est": grid_s, "ratio": (gpu_s / grid_s) if grid_s else None}


def changes(path: list[dict], measured: dict, workload: str = "bf16", floor: float = 0.02) -> list[dict]:
    """Per compared knob group (each path entry after the references): the GEMMs it was searched on,
    the knob values that differ from the incumbent's, whether the kept setting beats the incumbent
    beyond the noise (``moved``; otherwise the group is frozen, at the cheapest value that ties),
    and kept / incumbent and fastest / incumbent (geometric means of the session's rounds)."""
    out, inc = [], None
    for entry in path:
        if entry["session"] == "refs":
            inc = entry["kept"]
            continue
        group, gemms = entry["session"].split(":")[:2]
        before, after = _op_cfgs(inc, workload), _op_cfgs(entry["kept"], workload)
        diff = [f"{g} overlap dropped" for g in before if g not in after]
        for g, e in after.items():
            if g not in before:
                diff.append(f"{g} bulk overlap restored")
                continue
            keys = ["method"] if e["method"] != before[g]["method"] else sorted(set(e) | set(before[g]))
            diff += [f"{g}.{k} {before[g].get(k)}→{e.get(k)}" for k in keys if before[g].get(k) != e.get(k)]
        pts = measured.get(entry["session"]) or {}
        kept, base = pts.get(entry["kept"]), pts.get(inc)
        moved = (entry["kept"] != inc and kept is not None and base is not None
                 and compare_points(kept, base, floor=floor, tie="b").outcome == -1)
        out.append({"session": entry["session"], "group": group, "gemms": gemms.split("+"), "moved": moved,
                    "diff": diff, "kept_ratio": _ratio(center(kept), center(base)),
                    "fastest_ratio": _ratio(min((center(p) for p in pts.values()), default=math.inf),
                                            center(base))})
        inc = entry["kept"]
    return out


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 5) if math.isfinite(a) and math.isfinite(b) and b > 0 else None


def _op_cfgs(case_id: str, workload: str) -> dict:
    c = parse_case_id(case_id)
    return op_entries(case_ub_cfgs(c, workload=workload), c.op)
