"""The sessions the run still plans to measure, as far as its folder tells now (the progress line's
"planned so far", cli.progress).

Read from the records the checkpoints wrote: per op, the TP sizes its TP decision has reached (a TP whose
decision.json is not written yet may still lead to the next); per (op, TP) and search dimension, the
steps not yet measured (a knob search: its next session only, since the planner decides the one after
from this one's result; a bisection: every halving left of ceil(log2(candidates)), an upper bound; a
grid: its one session); the TP point's session; and with the layer stage on, the block session of each
TP every op has reached, and with workload.packing the packed block sessions (packing/plan.json's, or before
it the run's plan at the largest TP: search.packed.planned). A session whose session.json exists counts as
measured: what a rerun re-measures of the recorded sessions is Snakemake's to know (rules/common.smk
scheduled_sessions gives the progress record what its DAG holds when the invocation starts).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass

from tptune.records.run_dir import (SESSION_JSON, RunDir, layer_session_name, packed_session_name,
                                    point_session_name, step_session_name)
from tptune.search import packed
from tptune.search.steps import Dimension, dimensions, search_mode
from tptune.settings.resolve import Settings


@dataclass(frozen=True)
class Ahead:
    sessions: frozenset[str]   # the names (sessions/<name>) planned and not yet measured
    final: bool                # every op's search is over (search/done.json): no search session will come


def sessions_ahead(s: Settings, run: RunDir) -> Ahead:
    """Sessions planned and not yet measured (module doc)."""
    reached = {op: tps_reached(s, run, op) for op in s.ops}
    names: list[str] = []
    for op, tps in reached.items():
        for tp in tps:
            for name, dim in dimensions(s, op, tp).items():
                names += _dimension_ahead(s, run, op, tp, name, dim)
            names.append(point_session_name(op, tp))
    if s.layer.enabled and reached:
        names += [layer_session_name(tp) for tp in sorted(set.intersection(*(set(t) for t in reached.values())))]
    if s.layer.enabled and reached:
        names += packed_ahead(s, run)
    return Ahead(frozenset(n for n in names if not (run.sessions / n / SESSION_JSON).is_file()),
                 run.searches_done.is_file())


def packed_ahead(s: Settings, run: RunDir) -> list[str]:
    """The packed block sessions (workload.packing, search.packed): those packing/plan.json names once the
    decisions made it, else those the run would plan at the largest TP (search.packed.planned)."""
    if packed.packing_spec(s) is None:
        return []
    plan = _read(run.packing_plan_json)
    if plan is not None:
        return [str(n) for n in plan.get("sessions") or []]
    tp, caps, _ = packed.planned(s)
    return [packed_session_name(tp, c) for c, _ in caps]


def tps_reached(s: Settings, run: RunDir, op: str) -> list[int]:
    """The TP sizes ``op``'s TP decision has reached so far: the first, and each one a decision.json
    names as next (the chain of rules/common.smk tp_chain)."""
    tp, out = s.tp_sizes[0], []
    while True:
        out.append(tp)
        rec = _read(run.tp_decision(op, tp))
        nxt = rec.get("next") if rec is not None else None
        if not isinstance(nxt, int) or isinstance(nxt, bool) or nxt <= tp:
            return out
        tp = nxt


def _dimension_ahead(s: Settings, run: RunDir, op: str, tp: int, name: str, dim: Dimension) -> list[str]:
    """The sessions of the steps of one search dimension from its first unrecorded step on."""
    mode = search_mode(s, op)
    if mode != "knobs" and len(dim.candidates) < 2:
        return []                     # a fixed setting: nothing to measure
    step = 0
    while True:
        rec = _read(run.search_step(op, tp, name, step))
        if rec is None:
            break
        if rec.get("done"):
            return []
        step += 1
    last = math.ceil(math.log2(len(dim.candidates))) if mode == "bisect" else step + 1
    return [step_session_name(op, tp, name, k) for k in range(step, max(last, step + 1))]


def _read(path) -> dict | None:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None
