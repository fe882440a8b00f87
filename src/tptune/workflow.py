"""What the Snakemake rules ask of a run: which cases exist, how the searches step, what each needs.

A search *dimension* is one ordered list of candidates of one (op, TP) searched by bisection:
the chunk count of the torch backend's chunked method, or the SM count of one TE GEMM's bulk/pipeline
method. Fixed TE settings (ring_exchange) are dimensions with a single candidate. Every step of every
dimension is one Snakemake checkpoint job, so independent dimensions run in parallel.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .cases import Case, Variant, make_case, parse_case_id
from .search import bisect
from .search.methods import chunk_candidates, te_candidates
from .settings import Settings

METHOD_SEARCH_KEYS = ("te_methods", "num_sm", "pipeline", "chunks", "cga_size", "set_sm_margin")


@dataclass(frozen=True)
class Dimension:
    name: str                         # "chunks" | "<gemm>.<method>"
    candidates: tuple                 # ordered, cheapest first; (None,) for a fixed setting
    case_of: Callable[[object], Case]

    def cases(self) -> dict:
        return {v: self.case_of(v) for v in self.candidates}


def _search_cfg(s: Settings, op: str) -> dict:
    search = s.op_settings(op)["search"]
    return {k: search[k] for k in METHOD_SEARCH_KEYS if k in search}


def reference_cases(s: Settings, op: str, tp: int) -> list[Case]:
    """Measured for every (op, TP): no overlap, the no-communication bound, and for TE the defaults and presets."""
    refs = ["none", "nocomm"]
    if s.backend == "te":
        refs += ["ub.te"] + [f"ub.{p}" for p in s.op_settings(op)["search"].get("te_presets", [])]
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
    return s.op_settings(op)["search"].get("mode", "bisect")


def next_values(s: Settings, op: str, dim: Dimension, measured: dict) -> list:
    if search_mode(s, op) in ("grid", "joint"):
        return [v for v in dim.candidates if v not in measured]
    floor = s.config["decision"]["noise_floor"]
    return bisect.next_points(dim.candidates, measured, floor=floor)


def read_point(run_json: str | Path) -> dict:
    return json.loads(Path(run_json).read_text())


def step_record(s: Settings, op: str, tp: int, dim_name: str, step: int, prev: dict | None,
                run_dir: Path) -> dict:
    """One checkpoint step: gather the points measured so far, decide what to measure next."""
    dim = dimensions(s, op, tp)[dim_name]
    asked = list(prev["asked"]) if prev else []
    if prev:
        asked += prev["next"]
    measured = {}
    for v in asked:
        measured[v] = read_point(run_dir / dim.case_of(v).dir / "run.json")
    nxt = next_values(s, op, dim, measured)
    rec = {"op": op, "tp": tp, "dim": dim_name, "step": step, "mode": search_mode(s, op),
           "candidates": list(dim.candidates), "asked": asked, "next": nxt,
           "next_cases": [dim.case_of(v).id for v in nxt],
           "measured": {str(v): {"case": p["case"], "status": p["status"],
                                 "median_ms": (p.get("timing") or {}).get("total_ms", {}).get("median")}
                        for v, p in measured.items()},
           "done": not nxt}
    if not nxt:
        if rec["mode"] in ("grid", "joint"):
            from .search.points import point_median
            best = min(dim.candidates, key=lambda v: (point_median(measured[v]), dim.candidates.index(v)))
            path = [{"step": 1, "compared": list(dim.candidates), "kept": [best]}]
        else:
            best, path = bisect.result(dim.candidates, measured, floor=s.config["decision"]["noise_floor"])
        rec.update({"best": best, "best_case": dim.case_of(best).id, "path": path})
    return rec


def step_cases(s: Settings, op: str, tp: int, dim_name: str, prev: dict | None) -> list[Case]:
    """Cases step ``k`` needs measured: what step k-1 asked for (step 0: the first points)."""
    dim = dimensions(s, op, tp)[dim_name]
    values = prev["next"] if prev else next_values(s, op, dim, {})
    return [dim.case_of(v) for v in values]


def tuned_case(s: Settings, op: str, tp: int, results: dict[str, dict], points: dict[str, dict]) -> Case:
    """The case combining each dimension's winner: chunked.n<best> (torch), or for TE per GEMM the
    fastest of its methods' winners, all overrides on top of TE's defaults."""
    from .search.points import point_median

    if s.backend == "torch":
        return make_case(op, tp, results["chunks"]["best_case"].split(f"{op}-tp{tp}-", 1)[1])
    per_gemm: dict[str, tuple[float, Case]] = {}
    for name, res in results.items():
        gemm = name.split(".")[0]
        case = make_case(op, tp, res["best_case"].split(f"{op}-tp{tp}-", 1)[1])
        t = point_median(points[case.id])
        if gemm not in per_gemm or t < per_gemm[gemm][0]:
            per_gemm[gemm] = (t, case)
    overrides = tuple(o for _, c in per_gemm.values() for o in c.variant.overrides)
    return make_case(op, tp, Variant("ub", preset="te", overrides=overrides))


def point_cases(s: Settings, op: str, tp: int, results: list[dict], run_dir: Path) -> tuple[dict[str, dict], Case]:
    """What the TP point of (op, TP) compares besides the references: each search's winner (with its
    run.json) and the tuned combination of the winners."""
    results_by_dim = {r["dim"]: r for r in results}
    winners = {r["best_case"]: read_point(run_dir / parse_case_id(r["best_case"]).dir / "run.json")
               for r in results}
    return winners, tuned_case(s, op, tp, results_by_dim, winners)
