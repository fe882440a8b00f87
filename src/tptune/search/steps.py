"""What the Snakemake rules ask of a run: which cases exist, how the searches step, what each needs.

A search *dimension* is one ordered list of candidates of one (op, TP) searched by bisection:
the chunk count of the torch backend's chunked method, or the SM count of one TE GEMM's bulk/pipeline
method. Fixed TE settings (ring_exchange) are dimensions with a single candidate. Every step of every
dimension is one Snakemake checkpoint job, so independent dimensions run in parallel. In
``search.mode: knobs`` an (op, TP) has one dimension, ``knobs``, stepped by the knob planner
(knob_search.py): its values are case ids.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from tptune.cases import Case, Variant, make_case, parse_case_id
from tptune.model.ops import weight_shape
from tptune.records.run_dir import RunDir
from tptune.records.sessions import load_session
from tptune.search import bisect, knob_search
from tptune.settings.resolve import Settings
from tptune.stats.pick import pick_best
from tptune.stats.rounds import Ratio
from tptune.te.methods import chunk_candidates, te_candidates
from tptune.te.ubcfg import distinct_settings

METHOD_SEARCH_KEYS = ("te_methods", "num_sm", "pipeline", "chunks", "cga_size", "set_sm_margin")


@dataclass(frozen=True)
class Dimension:
    name: str                         # "chunks" | "<gemm>.<method>"
    candidates: tuple                 # ordered, cheapest first; (None,) for a fixed setting
    case_of: Callable[[object], Case]

    def cases(self) -> dict:
        return {v: self.case_of(v) for v in self.candidates}


def _search_cfg(s: Settings, op: str) -> dict:
    return s.op(op).search.given_of(METHOD_SEARCH_KEYS)


def reference_cases(s: Settings, op: str, tp: int) -> list[Case]:
    """Measured for every (op, TP): no overlap, the no-communication bound, and for TE the defaults and presets."""
    refs = ["none", "nocomm"]
    if s.backend == "te":
        refs += ["ub.te"] + [f"ub.{p}" for p in s.op(op).search.te_presets]
    return [make_case(op, tp, v) for v in refs]


def _joint(op: str, tp: int, dims: dict[str, Dimension]) -> dict[str, Dimension]:
    """One dimension over every combination of the per-GEMM candidates (the exhaustive grid).
    A candidate is the variant suffix of the combined overrides, e.g. "dgrad.bulk.sm8+wgrad.bulk.sm4"."""
    combos = [""]
    for dim in dims.values():
        suffixes = [dim.case_of(v).variant_id.split("+", 1)[1] for v in dim.candidates]
        combos = [f"{c}+{x}" if c else x for c in combos for x in suffixes]
    cands = tuple(combos)
    return {"joint": Dimension("joint", cands, lambda v, op=op, tp=tp: make_case(op, tp, f"ub.te+{v}"))}


def dimensions(s: Settings, op: str, tp: int) -> dict[str, Dimension]:
    if search_mode(s, op) == "knobs":
        refs = tuple(knob_search.first_session(s, op, tp).members)  # later steps' values: the planner's
        return {knob_search.DIM: Dimension(knob_search.DIM, refs, parse_case_id)}
    cfg = _search_cfg(s, op)
    if s.backend == "torch":
        cands = tuple(chunk_candidates(cfg))
        return {"chunks": Dimension("chunks", cands,
                                    lambda n, op=op, tp=tp: make_case(op, tp, Variant("chunked", chunks=n)))}
    dims = {}
    for gemm, plans in te_candidates(op, tp, cfg).items():
        for plan in plans:
            name = f"{gemm}.{plan.method}"
            dims[name] = Dimension(name, tuple(plan.sm_candidates) or (None,),
                                   lambda v, plan=plan: plan.case(v))
    if search_mode(s, op) == "joint":
        if any(len(plans) > 1 for plans in te_candidates(op, tp, cfg).values()):
            raise ValueError(f"search.mode joint for {op}: give one method per GEMM in te_methods")
        return _joint(op, tp, dims)
    return dims


def search_mode(s: Settings, op: str) -> str:
    return s.op(op).search.mode


def next_values(s: Settings, op: str, dim: Dimension, measured: dict, pairs: dict | None = None) -> list:
    if search_mode(s, op) in ("grid", "joint"):
        return [v for v in dim.candidates if v not in measured] if len(dim.candidates) > 1 else []
    win, floor = s.decision.step_margins
    return bisect.next_points(dim.candidates, measured, floor=floor, pairs=pairs if pairs is not None else {},
                              win=win)


def _step_values(s: Settings, op: str, dim: Dimension, prev: dict | None) -> list:
    """Values step k measures side by side: what step k-1 asked for (step 0: the first points; for
    the knob search, its first session: the references)."""
    if prev:
        return list(prev["next"])
    return list(dim.candidates) if search_mode(s, op) == "knobs" else next_values(s, op, dim, {})


def step_cases(s: Settings, op: str, tp: int, dim_name: str, prev: dict | None) -> list[Case]:
    dim = dimensions(s, op, tp)[dim_name]
    return [dim.case_of(v) for v in _step_values(s, op, dim, prev)]


def step_record(s: Settings, op: str, tp: int, dim_name: str, step: int, prev: dict | None,
                run_dir: Path) -> dict:
    """One checkpoint step: the session of this step's points (if it measured any) joins the earlier
    steps' sessions; the search decides what to measure next, comparing only points of one session."""
    if search_mode(s, op) == "knobs":
        return knob_search.step_record(s, op, tp, step, prev, run_dir)
    dim = dimensions(s, op, tp)[dim_name]
    sessions = list(prev["sessions"]) if prev else []
    values = _step_values(s, op, dim, prev)
    if values:
        rel = str(RunDir(".").step_session(op, tp, dim_name, step))
        sessions.append({"step": step, "values": values, "session": rel})
    win, floor = s.decision.step_margins
    measured, pairs = {}, {}
    for entry in sessions:
        runs = load_session(Path(run_dir) / entry["session"]).points
        pts = {v: runs[dim.case_of(v).id] for v in entry["values"]}
        measured.update(pts)
        if len(entry["values"]) == 2:
            pairs[tuple(entry["values"])] = (pts[entry["values"][0]], pts[entry["values"][1]])
    mode = search_mode(s, op)
    nxt = next_values(s, op, dim, measured, pairs)
    rec = {"op": op, "tp": tp, "dim": dim_name, "step": step, "mode": mode,
           "candidates": list(dim.candidates), "asked": [v for e in sessions for v in e["values"]],
           "sessions": sessions, "next": nxt, "next_cases": [dim.case_of(v).id for v in nxt],
           "measured": {str(v): p.search_summary() for v, p in measured.items()},
           "done": not nxt}
    if not nxt:
        if len(dim.candidates) == 1:
            best, path = dim.candidates[0], []
        elif mode in ("grid", "joint"):
            champion, comparisons = pick_best([measured[v] for v in dim.candidates], floor)
            best = next(v for v in dim.candidates if measured[v] is champion)
            path = [{"step": 1, "compared": list(dim.candidates), "kept": [best], "comparisons": comparisons}]
        else:
            best, path = bisect.result(dim.candidates, measured, floor=floor, pairs=pairs, win=win)
        rec.update({"best": best, "best_case": dim.case_of(best).id, "path": path})
        ru = (runner_up(path, best, floor) if mode == "bisect" and s.op(op).search.runner_up
              else None)   # grid/joint measured every value side by side already
        if ru is not None:
            rec["runner_up_case"] = dim.case_of(ru).id
    return rec


def runner_up(path: list[dict], best, floor: float):
    """The value the best was last compared with in a bisection, when that step did not clear the noise
    floor (a tie there, or a win inside the floor at the step margin); else None. Such a step is a coin
    for an effect near the margin, so the TP point decides it again beside the references."""
    for step in reversed(path):
        if best not in step["compared"] or "comparison" not in step:
            continue
        other = next(v for v in step["compared"] if v != best)
        r = Ratio.from_dict(step["comparison"].get("ratio"))
        near = (r.outcome(floor)[0] if r else step["comparison"]["outcome"]) == 0
        return other if near else None
    return None


def canary_case(s: Settings, tp: int) -> Case:
    """The drift canary: TE defaults (te) or no overlap (torch) of the op with the most GEMM work."""
    op = max(s.ops, key=lambda o: math.prod(weight_shape(o, s.model)))
    return make_case(op, tp, "ub.te" if s.backend == "te" else "none")


def point_members(s: Settings, op: str, tp: int, results: list[dict]) -> tuple[list[Case], list[Case]]:
    """What the TP point of (op, TP) measures side by side: the references, each search's winner and
    the tuned combination of the winners (the last returned apart too)."""
    winners = [parse_case_id(r["best_case"]) for r in results]
    # the knob search's best setting in the other dgrad mode: the layer stage may need it (one switch)
    winners += [parse_case_id(r["alternative"]) for r in results if r.get("alternative")]
    tuned = tuned_cases(s, op, tp, {r["dim"]: r for r in results})
    refs = reference_cases(s, op, tp)  # the named yardsticks stay, even where two are the same setting
    distinct = distinct_settings(refs + winners + tuned, s.model.workload.ub_rules)
    return refs + [c for c in distinct if c not in refs], tuned


def point_contenders(members: list[Case]) -> list[str]:
    """Settings a point picks from: all but the no-communication bound."""
    return [c.id for c in members if c.variant.kind != "nocomm"]


def tuned_cases(s: Settings, op: str, tp: int, results: dict[str, dict]) -> list[Case]:
    """The combinations of the dimensions' winners: chunked.n<best> (torch); for TE, every GEMM's
    winning override on top of TE's defaults, one combination per choice of method where a GEMM has
    several (e.g. qkv dgrad ring_exchange or bulk) or per runner-up value (search.runner_up): the
    point session measures them side by side."""
    if search_mode(s, op) == "knobs":  # the planner's answer is one whole setting of the op
        return [parse_case_id(results["knobs"]["best_case"])]
    if s.backend == "torch":
        return [make_case(op, tp, results["chunks"]["best_case"].split(f"{op}-tp{tp}-", 1)[1])]
    per_gemm: dict[str, list[Case]] = {}
    for name, res in results.items():
        gemm = name.split(".")[0]
        for key in ("best_case", "runner_up_case"):     # a runner-up (search.runner_up) joins as a choice
            if res.get(key):
                per_gemm.setdefault(gemm, []).append(parse_case_id(res[key]))
    out = []
    for combo in itertools.product(*per_gemm.values()):
        overrides = tuple(o for c in combo for o in c.variant.overrides)
        out.append(make_case(op, tp, Variant("ub", preset="te", overrides=overrides)))
    return out


