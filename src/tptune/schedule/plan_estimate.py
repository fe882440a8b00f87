"""A run's wall time on its node predicted before anything is measured (``tptune plan``'s
wall_predicted.json, and ``snakemake -n``'s line).

The sessions are those the search will plan where nothing moves (every setting ties, as
benchmarks/knob_sessions.py steps the knob planner): per op and TP the search's steps with their members
(the knob planner's sessions, or each dimension's bisection / grid steps), the TP point (the references,
the search's winners and the tuned combination), and the layer stage's block per TP (none, its bound,
TE's defaults, the presets, the tuned combination), and with ``workload.packing`` one packed block session per
capacity T (search.packed.planned: no overlap, the set and the best preset at T beside the native points; counted
at the largest TP, since the model TP is known only after the decisions; a member-round a block's scaled by its
tokens over the workload's and by the forward-only timing every packed round adds); every TP of ``tp_sizes`` is counted for every op (an
upper bound unless ``decision.explore_all_tps``). A session's rounds are its round budget times the
share sessions of its kind used in the committed runs; its seconds are its member-rounds times the
committed runs' seconds per member-round of its kind and TP (schedule.wall_fit), and the bookkeeping,
group starts, start-up and tail are theirs too. The sessions are then laid on the node as a measured run's
are (schedule.simulate). The confirm stage (te, confirm.enabled) follows, one launch after another: its
rounds x 3 launches, each the committed launches' median start-up plus its iterations at their median
iteration time (the model's own iteration is not known before it is measured). The fit is of GPU runs: for
the torch (CPU) backend the figure is rough.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from tptune.model.plan import cpu_size_ratio
from tptune.schedule import measured as ms
from tptune.schedule.simulate import Job, Node, simulate
from tptune.schedule.wall_fit import load_table, member_round_s
from tptune.records.run_dir import packed_session_name
from tptune.search import knob_search, packed, steps
from tptune.search.knobs import plan_result
from tptune.settings.resolve import Settings

MAX_STEPS = 200            # a search that plans more steps than this (it never should) stops being counted
IDLE_TIMEOUT_S = 30.0
_ROUNDS = (1.0, 1.004, 0.998, 1.001)      # one drift shared by a session's members: nothing moves


@dataclass
class PlannedSession:
    name: str
    tp: int
    kind: str
    members: int
    rounds: int
    seconds: float


@dataclass
class WallEstimate:
    gpus: int
    predicted_wall_s: float
    sessions: list[PlannedSession]
    per_tp: dict
    basis: str
    rough: bool
    notes: list[str] = field(default_factory=list)
    explores_all: bool = True       # decision.explore_all_tps: every TP counted is measured
    confirm_s: float = 0.0          # the confirm stage's share of predicted_wall_s (0: off)
    unit: str = "GPUs"              # what ``gpus`` counts: GPUs, or on CPU the pool's worker slots
    measured: int = 0               # planned sessions already recorded, left out (the dry run's ``done``)

    def as_record(self) -> dict:
        """wall_predicted.json (keys other tools read: gpus, sessions_planned, predicted_wall_s, basis, per_tp)."""
        per_tp = {}
        for tp, d in self.per_tp.items():
            mine = [x for x in self.sessions if x.tp == tp]
            per_tp[str(tp)] = {
                "sessions": d["sessions"], "member_rounds": sum(x.members * x.rounds for x in mine),
                **{k: sum(1 for x in mine if x.kind == k) for k in ("steps", "points", "blocks")},
                "held_s": round(d["held_s"], 1), "group_starts": d["group_starts"],
                "first_start_s": round(d["first_start_s"], 1), "last_end_s": round(d["last_end_s"], 1)}
        return {"gpus": self.gpus, "unit": self.unit, "sessions_planned": len(self.sessions),
                "predicted_wall_s": round(self.predicted_wall_s), "basis": self.basis, "rough": self.rough,
                "per_tp": per_tp, "confirm_s": round(self.confirm_s), "notes": self.notes,
                "upper_bound": not self.explores_all}

    def line(self) -> str:
        tps = ", ".join(f"TP {tp} {d['sessions']}" for tp, d in self.per_tp.items())
        where = (f"{self.gpus} {self.unit}" if not self.rough else
                 f"{self.gpus} {self.unit}; rough: costed as on GPUs, the CPU backend's rounds run longer")
        upper = "" if self.explores_all else ", at most: the TP decision may stop earlier"
        confirm = f"; the confirm stage {self.confirm_s:.0f} s of it" if self.confirm_s else ""
        done = (f"; {self.measured} already measured with these settings, not counted" if self.measured else "")
        return (f"predicted wall time on this node ({where}): {self.predicted_wall_s:.0f} s for "
                f"{len(self.sessions)} planned sessions ({tps or 'none left'}{upper}){done}{confirm}")


def _flat_point(case: str) -> dict:
    return knob_search.synthetic_point(case, 10.0, _ROUNDS)


def _knob_search(s: Settings, op: str, tp: int) -> tuple[list[int], list[dict]]:
    """Members per step of the knob search over a flat landscape, and its result as the point reads it."""
    sizes, measured = knob_search.walk(s, op, tp, lambda case: 10.0, _ROUNDS, max_steps=MAX_STEPS)
    res = plan_result(op, tp, measured=measured, **knob_search.planner_args(s, op, tp))
    return sizes, [{"dim": knob_search.DIM, "best_case": res.case, "alternative": res.alternative}]


def _dimension_search(s: Settings, op: str, tp: int) -> tuple[dict[str, list[int]], list[dict]]:
    """Members per step of each dimension's search (bisection, grid) over a flat landscape, and the
    results as the point reads them (the cheapest value of each: ties go to it)."""
    out, results = {}, []
    for name, dim in steps.dimensions(s, op, tp).items():
        measured, pairs, sizes = {}, {}, []
        while len(sizes) < MAX_STEPS and (nxt := steps.next_values(s, op, dim, measured, pairs)):
            pts = {v: _flat_point(dim.case_of(v).id) for v in nxt}
            measured.update(pts)
            if len(nxt) == 2:
                pairs[tuple(nxt)] = (pts[nxt[0]], pts[nxt[1]])
            sizes.append(len(nxt))
        if sizes:
            out[name] = sizes
        results.append({"dim": name, "best": dim.candidates[0], "best_case": dim.case_of(dim.candidates[0]).id})
    return out, results


def _block_members(s: Settings) -> int:
    if s.backend != "te":
        return 3                                          # none, nocomm, the tuned chunk count
    bound = s.layer.bound and not s.model.model.is_moe
    return 3 + int(bound) + len(s.search.te_presets or [])   # none, [nocomm], ub.te, presets, tuned


def planned_sessions(s: Settings, table: dict, packed_plan: tuple | None = None
                     ) -> tuple[list[ms.MeasuredSession], list[PlannedSession]]:
    """The sessions the run will plan (module doc), as the scheduler's sessions and as costed; ``packed_plan``:
    search.packed.planned(s) where the caller has it already (it reads the lengths file)."""
    out: list[PlannedSession] = []

    def add(name: str, tp: int, kind: str, members: int, budget: int | None, lo: int | None, scale: float = 1.0):
        share = table["rounds_share"].get(kind, 1.0)
        budget = int(budget or 4)
        rounds = min(budget, max(int(lo or 1), math.ceil(budget * share)))
        per_mr, _ = member_round_s(table, kind, tp)
        out.append(PlannedSession(name, tp, kind, members, rounds,
                                  members * rounds * per_mr * cpu_scale(s, tp) * scale))

    for tp in s.tp_sizes:
        for op in s.ops:
            t = s.op(op).timing
            if steps.search_mode(s, op) == "knobs":
                sizes, results = _knob_search(s, op, tp)
                per_dim = {knob_search.DIM: sizes}
            else:
                per_dim, results = _dimension_search(s, op, tp)
            for dim, sizes in per_dim.items():
                for k, n in enumerate(sizes):
                    add(f"{op}/tp{tp}/{dim}/step{k}", tp, "steps", n, t.max_rounds, t.min_rounds)
            members, _ = steps.point_members(s, op, tp, results)
            add(f"{op}/tp{tp}/point", tp, "points", len(members), t.max_rounds, t.min_rounds)
        if s.layer.enabled:
            add(f"layer/tp{tp}", tp, "blocks", _block_members(s), s.timing.max_rounds, s.timing.min_rounds)
    ptp, pk, _ = packed_plan or packed.planned(s)     # workload.packing: after the decisions (search.packed)
    for cap, tokens in pk:
        add(packed_session_name(ptp, cap), ptp, "blocks", len(tokens), s.timing.max_rounds, s.timing.min_rounds,
            packed_scale(s, tokens))
    as_measured = [ms.MeasuredSession(name=x.name, op=ms.parse_name(x.name)[0], tp=x.tp, kind=x.kind,
                                      dim=ms.parse_name(x.name)[3], step=ms.parse_name(x.name)[4],
                                      started=float(i), held_s=x.seconds, start_s=0.0, group_starts=0,
                                      members=x.members, rounds=x.rounds, gpu_ids=None)
                   for i, x in enumerate(out)]
    return as_measured, out


def packed_scale(s: Settings, tokens: list[int]) -> float:
    """A packed session's member-round over a block's (the fit's kind): its members' mean tokens over the
    workload's (seq x micro-batch; GEMMs grow linearly in the tokens, attention within each sequence less), and
    the forward-only timing every packed round adds."""
    w = s.model.workload
    return sum(tokens) / len(tokens) / (w.seq_length * w.micro_batch_size) * (1 + packed.FORWARD_ONLY_SHARE)


def cpu_scale(s: Settings, tp: int) -> float:
    """What a CPU run's member-rounds take beyond the fit's: its ops' GEMM work per iteration over the CPU
    default's (model.plan.cpu_size_ratio), never below 1; 1 on GPUs."""
    return 1.0 if s.device == "cuda" else max(1.0, cpu_size_ratio(s.model, tp, s.ops))


def confirm_seconds(s: Settings, table: dict) -> tuple[float, str | None]:
    """The confirm stage's predicted seconds (module doc) and how, or (0, None) where it does not run."""
    fitted = table.get("confirm")
    if not (s.confirm.enabled and s.backend == "te"):
        return 0.0, None
    launches = s.confirm.rounds * 4        # the fewest rounds of [set, preset, nemo_tp4, none]
    if not fitted:
        return 0.0, "the confirm stage not counted: no committed confirm.json to cost its launches with"
    per = fitted["launch_start_s"] + s.confirm.iters * fitted["iteration_s"]
    total = max(launches * per, s.confirm.budget_s)
    return total, (f"the confirm stage: its fewest {launches} launches of {per:.0f} s (the median start-up of "
                   f"the committed launches and {s.confirm.iters} iterations at their median "
                   f"{fitted['iteration_s']:.2f} s), or its {s.confirm.budget_s:.0f} s budget where that is longer: "
                   "rounds are added until the headline ratios resolve or the budget ends")


def _widths(tps: list[int], slots: int, cpu: bool) -> tuple[int, dict[int, int]]:
    """(the pool's ids the sessions are laid on, each TP's ids a session holds). On GPUs a TP t session holds t;
    on CPU one holds min(t, the pool's slots), as the launcher gives a case with more ranks than the pool
    has slots all of them, and the pool is cut to a size every such block divides (the scheduler's aligned
    blocks)."""
    if not cpu:
        return slots, {tp: tp for tp in tps}
    g = max(1, slots)
    while any(g % min(tp, g) for tp in tps):
        g -= 1
    return g, {tp: min(tp, g) for tp in tps}


def estimate(s: Settings, gpus: int | None = None, table: dict | None = None,
             done=frozenset()) -> WallEstimate:
    """The run's predicted wall time on ``gpus`` GPUs (on CPU: worker slots; default: the run's
    gpus_per_node; the CLI gives the pool's size, cli.wall.pool_size). ``done``: planned session names already
    measured (the dry run of a run under way), left out with what waits for them."""
    table = table if table is not None else load_table()
    gpus = int(gpus or s.gpus_per_node)
    packed_plan = packed.planned(s)
    sessions, planned = planned_sessions(s, table, packed_plan)
    deps = ms.dependencies(sessions)
    measured = sum(1 for x in planned if x.name in done)
    if measured:
        sessions = [x for x in sessions if x.name not in done]
        planned = [x for x in planned if x.name not in done]
        deps = {n: (tuple(d for d in ds if d not in done), kind) for n, (ds, kind) in deps.items()}
    laid, width = _widths(list(s.tp_sizes), gpus, s.device != "cuda")
    jobs = [Job(x.name, width[x.tp], x.held_s, deps[x.name][0], table["gaps_s"][deps[x.name][1]],
                priority=x.started) for x in sessions]
    node = Node(gpus=laid, start_s={w: table["group_start_s"] for w in width.values()},
                launch_gap_s=table["gaps_s"]["launch"],
                idle_timeout_s=float(s.launcher.idle_timeout_s or IDLE_TIMEOUT_S),
                keep_idle_groups=s.launcher.keep_idle_groups)
    sched = simulate(jobs, node)
    tp_of = {x.name: x.tp for x in sessions}   # per TP, not per block width
    sched.placed = {n: dataclasses.replace(p, tp=tp_of[n]) for n, p in sched.placed.items()}
    rough = s.backend != "te"
    unit = "GPUs" if s.device == "cuda" else "worker slots"
    notes = [f"every TP of {s.tp_sizes} counted for every op"
             + ("" if s.decision.explore_all_tps else " (an upper bound: the TP decision may stop earlier)"),
             "the search where nothing moves (every setting ties)"]
    if rough:
        notes.append("rough: seconds per member-round fitted on GPU runs, this run measures on CPU")
    if s.device != "cuda" and (r := cpu_scale(s, min(s.tp_sizes))) > 1:
        notes.append(f"on CPU each member-round costed {r:.0f}× the fit's: the model's GEMM work per iteration over "
                     "the CPU default's")
    ptp, pcaps, pnote = packed_plan
    if pcaps:
        notes.append(f"{len(pcaps)} packed block sessions (workload.packing: T = {', '.join(str(c) for c, _ in pcaps)}, "
                     f"each beside the native points) counted at TP {ptp} (the model TP is known only after the "
                     "decisions), as blocks scaled by their tokens over the workload's and by the forward-only "
                     "timing" + (f"; {pnote}" if pnote else ""))
    confirm_s, confirm_note = confirm_seconds(s, table)
    if confirm_note:
        notes.append(confirm_note)
    basis = (f"{len(planned)} sessions planned where nothing moves, costed with the fit of "
             f"{len(table['runs'])} committed GPU runs (tptune/data/wall_fit.json), laid on {gpus} {unit}"
             + ("; rough: CPU backend" if rough else ""))
    return WallEstimate(gpus=gpus, predicted_wall_s=table["outside_s"] + sched.span_s + confirm_s,
                        sessions=planned, per_tp=sched.per_tp(), basis=basis, rough=rough, notes=notes,
                        explores_all=bool(s.decision.explore_all_tps), confirm_s=confirm_s, unit=unit,
                        measured=measured)
