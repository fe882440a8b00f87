"""What the Snakemake rules ask of a run: which cases exist, how the searches step, what each needs.

A search *dimension* is one ordered list of candidates of one (op, TP) searched by bisection:
the chunk count of the torch backend's chunked method, or the SM count of one TE GEMM's bulk/pipeline
method. Fixed TE settings (ring_exchange) are dimensions with a single candidate. Every step of every
dimension is one Snakemake checkpoint job, so independent dimensions run in parallel. In
``search.mode: knobs`` an (op, TP) has one dimension, ``knobs``, stepped by the knob planner
(knob_search.py): its values are case ids.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import knob_search
from .cases import Case, Variant, make_case, parse_case_id
from .search import bisect
from .search.methods import chunk_candidates, te_candidates
from .search.points import point_summary
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
    return s.op_settings(op)["search"].get("mode", "bisect")


def step_margins(s: Settings) -> tuple[float, float]:
    """(win, tie) margins of a search step's paired comparison: a value wins beyond
    decision.step_margin, a resolved tie lies within decision.noise_floor. A run recorded without
    step_margin (before it existed) replays with the noise floor for both, as it was measured."""
    d = s.config["decision"]
    return float(d.get("step_margin", d["noise_floor"])), float(d["noise_floor"])


def next_values(s: Settings, op: str, dim: Dimension, measured: dict, pairs: dict | None = None) -> list:
    if search_mode(s, op) in ("grid", "joint"):
        return [v for v in dim.candidates if v not in measured] if len(dim.candidates) > 1 else []
    win, floor = step_margins(s)
    return bisect.next_points(dim.candidates, measured, floor=floor, pairs=pairs if pairs is not None else {},
                              win=win)


def read_point(run_json: str | Path) -> dict:
    return json.loads(Path(run_json).read_text())


def session_dir(run_dir: Path, op: str, tp: int, name: str) -> Path:
    """Where a session's members and session.json live: sessions/<op>/tp<N>/<dim>/step<k> or .../point."""
    return Path(run_dir) / "sessions" / op / f"tp{tp}" / name


def read_session(run_dir: Path, rel: str) -> tuple[dict, dict[str, dict]]:
    """(session.json, {case id: its run.json}) of a recorded session."""
    d = Path(run_dir) / rel
    sess = json.loads((d / "session.json").read_text())
    return sess, {cid: read_point(d / p) for cid, p in sess["runs"].items()}


def _step_values(s: Settings, op: str, dim: Dimension, prev: dict | None) -> list:
    """Values step k measures side by side: what step k-1 asked for (step 0: the first points; for
    the knob search, its first session: the references)."""
    if prev:
        return list(prev["next"])
    return list(dim.candidates) if search_mode(s, op) == "knobs" else next_values(s, op, dim, {})


def step_cases(s: Settings, op: str, tp: int, dim_name: str, prev: dict | None) -> list[Case]:
    dim = dimensions(s, op, tp)[dim_name]
    return [dim.case_of(v) for v in _step_values(s, op, dim, prev)]


def step_session_name(dim_name: str, step: int) -> str:
    return f"{dim_name}/step{step}"


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
        rel = str(session_dir(Path("."), op, tp, step_session_name(dim_name, step)))
        sessions.append({"step": step, "values": values, "session": rel})
    win, floor = step_margins(s)
    measured, pairs = {}, {}
    for entry in sessions:
        _, runs = read_session(run_dir, entry["session"])
        pts = {v: runs[dim.case_of(v).id] for v in entry["values"]}
        measured.update(pts)
        if len(entry["values"]) == 2:
            pairs[tuple(entry["values"])] = (pts[entry["values"][0]], pts[entry["values"][1]])
    mode = search_mode(s, op)
    nxt = next_values(s, op, dim, measured, pairs)
    rec = {"op": op, "tp": tp, "dim": dim_name, "step": step, "mode": mode,
           "candidates": list(dim.candidates), "asked": [v for e in sessions for v in e["values"]],
           "sessions": sessions, "next": nxt, "next_cases": [dim.case_of(v).id for v in nxt],
           "measured": {str(v): point_summary(p) for v, p in measured.items()},
           "done": not nxt}
    if not nxt:
        if len(dim.candidates) == 1:
            best, path = dim.candidates[0], []
        elif mode in ("grid", "joint"):
            from .decide import pick_best
            champion, comparisons = pick_best([measured[v] for v in dim.candidates], floor)
            best = next(v for v in dim.candidates if measured[v] is champion)
            path = [{"step": 1, "compared": list(dim.candidates), "kept": [best], "comparisons": comparisons}]
        else:
            best, path = bisect.result(dim.candidates, measured, floor=floor, pairs=pairs, win=win)
        rec.update({"best": best, "best_case": dim.case_of(best).id, "path": path})
        ru = (runner_up(path, best, floor) if mode == "bisect" and s.op_settings(op)["search"].get("runner_up")
              else None)   # grid/joint measured every value side by side already
        if ru is not None:
            rec["runner_up_case"] = dim.case_of(ru).id
    return rec


def runner_up(path: list[dict], best, floor: float):
    """The value the best was last compared with in a bisection, when that step did not clear the noise
    floor (a tie there, or a win inside the floor at the step margin); else None. Such a step is a coin
    for an effect near the margin, so the TP point decides it again beside the references."""
    from .search.rounds import Ratio

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
    import math

    from .ops import weight_shape

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


def distinct_settings(cases: list[Case], workload: str = "bf16") -> list[Case]:
    """Cases in order, dropping any whose effective setting an earlier one already has (e.g.
    ub.te+dgrad.ring for fc2 is TE's default fc2_dgrad: the same ub_cfgs as ub.te)."""
    from .search.ubcfg import case_ub_cfgs, op_entries

    seen, out = set(), []
    for c in cases:
        if c.variant.kind == "ub":
            cfg = case_ub_cfgs(c, workload=workload)
            key = json.dumps(op_entries(cfg, c.op), sort_keys=True)
        else:
            key = c.variant_id
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def point_contenders(members: list[Case]) -> list[str]:
    """Settings a point picks from: all but the no-communication bound."""
    return [c.id for c in members if c.variant.kind != "nocomm"]


def tuned_cases(s: Settings, op: str, tp: int, results: dict[str, dict]) -> list[Case]:
    """The combinations of the dimensions' winners: chunked.n<best> (torch); for TE, every GEMM's
    winning override on top of TE's defaults, one combination per choice of method where a GEMM has
    several (e.g. qkv dgrad ring_exchange or bulk) or per runner-up value (search.runner_up): the
    point session measures them side by side."""
    import itertools

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


# -- what a measuring job measures with ----------------------------------------------------------
# A session's *measurement settings*: exactly what its measuring job hands the launcher, and nothing
# else. The measuring rules' params are these (so a changed setting re-measures exactly the sessions
# it touches, and a decision-only one none), the job refuses to measure when the run's config.json
# gives other ones than it was scheduled with, and session.json records them ("settings").
# Everything else in the run config only derives (decisions, configs, report) or runs the machinery
# (launcher pool, time-outs, retries): docs/run-integrity.md.
MEASURE_LAUNCHER_KEYS = ("multicast", "env", "cpu_threads_per_rank")


def measurement(s: Settings, op_settings: dict, members: list[str] | None, *, canary: str | None,
                margin: float, tie_margin: float | None, evidence: bool, contenders: list[str] | None = None,
                always: list[str] | None = None, layer: dict | None = None) -> dict:
    """A session's measurement settings (see above). ``members`` None: they follow from the job's
    input files (the layer stage's block settings come from the TP points). The run's ``faults`` (a
    testing aid that makes a member fail, as a machine might) are not among them: changing them
    re-measures nothing; ``snakemake -R $(tptune failed <run>)`` re-measures failed sessions."""
    lc = s.config.get("launcher") or {}
    model = {k: v for k, v in s.model.to_dict().items() if k != "source"}   # what is measured, not where it was read
    return {"backend": s.backend, "device": s.device, "model": model,
            "timing": dict(op_settings["timing"]), "check": bool(op_settings.get("check", False)),
            "atomic_gemm": bool((op_settings.get("search") or {}).get("atomic_gemm", False)),
            "layer": layer, "members": members, "contenders": contenders, "always": always, "canary": canary,
            "evidence": evidence, "margin": margin, "tie_margin": tie_margin,
            "launcher": {k: lc.get(k) for k in MEASURE_LAUNCHER_KEYS}}


def launcher_op_settings(m: dict) -> dict:
    """The op settings Launcher.session takes, from a measurement (nothing else reaches it)."""
    return {"timing": dict(m["timing"]), "check": m["check"], "search": {"atomic_gemm": m["atomic_gemm"]},
            **({"layer": m["layer"]} if m["layer"] is not None else {})}


def settings_digest(m: dict) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(m, sort_keys=True, default=str).encode()).hexdigest()[:16]


def step_measurement(s: Settings, op: str, tp: int, dim: str, prev: dict | None) -> dict:
    cases = step_cases(s, op, tp, dim, prev)
    win, floor = step_margins(s)
    return measurement(s, s.op_settings(op), [c.id for c in cases], canary=None, margin=win, tie_margin=floor,
                       evidence=False)


def point_measurement(s: Settings, op: str, tp: int, results: list[dict]) -> dict:
    members, _ = point_members(s, op, tp, results)
    ids = [c.id for c in members]
    return measurement(s, s.op_settings(op), ids, canary=canary_case(s, tp).id,
                       margin=s.config["decision"]["noise_floor"], tie_margin=None, evidence=True,
                       contenders=point_contenders(members))


def layer_measurement(s: Settings, tp: int) -> dict:
    """The layer stage of one TP: its block settings follow from the TP points (its inputs)."""
    ops = dict(s.op_settings(s.ops[0]))
    ops["check"] = True
    return measurement(s, ops, None, canary=canary_case(s, tp).id, margin=s.config["decision"]["noise_floor"],
                       tie_margin=None, evidence=True,
                       layer={k: v for k, v in (s.config.get("layer") or {}).items() if k != "enabled"}) | (
        {"presets": list(s.config["search"].get("te_presets") or [])} if s.backend == "te" else {})


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


_RUN_LOCK = None   # the open lock file of the run this process (snakemake) drives; closed at exit


def start_run(run_dir: str | Path, config_json: str | Path, text: str) -> None:
    """Snakemake's onstart (after its lock, never in a dry run): hold the run's lock for the life of this
    process, then write the resolved config where it changed. Another invocation running this run
    holds the lock: refused, with nothing written (its jobs read this config.json)."""
    import fcntl
    import os

    from .errors import TptuneError

    global _RUN_LOCK
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    fh = open(run_dir / ".run.lock", "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "?"
        fh.close()
        raise TptuneError(f"{run_dir} is being run by another snakemake (pid {holder}): nothing written; wait for "
                          "it to end (or stop it) and run again") from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    _RUN_LOCK = fh
    try:
        same = Path(config_json).read_text() == text
    except OSError:
        same = False
    if not same:
        write_text_atomic(config_json, text)
