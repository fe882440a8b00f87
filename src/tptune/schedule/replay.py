"""A measured run's sessions replayed onto a node of G GPUs (schedule.simulate): the run's wall time there.

Each session keeps the time it held its GPUs, less its worker-group start (the simulation starts groups
where the node needs them, at the run's measured start cost per TP). The bookkeeping between sessions is
the run's own median wait per edge kind (schedule.measured.gaps), and the time outside the sessions' span
(Snakemake's start-up, the model and plan jobs before the first session; analysis, collect, decide and
report after the last) is the run's wall_s.txt minus that span.

A TP the run did not measure above its largest (TP 8 from a TP 2 + 4 run on 4 GPUs) is extrapolated per op
and session kind: its sessions are those of the largest measured TP (the same steps, members and rounds),
each taking that TP's seconds per member-round times the measured ratio of the two largest TPs' seconds
per member-round (TP 8 = TP 4 x (TP 4 / TP 2) for each op's steps, its point, and the block); its group
start is TP 4's start x (TP 4 / TP 2 starts). Every op measured at the largest TP is assumed to go on to
the next, as ``decision.explore_all_tps`` makes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from tptune.records.progress import confirm_in_wall_s, measured_wall_s
from tptune.errors import ConfigError, RecordError, TptuneError
from tptune.model.spec import ModelConfig, parse_model
from tptune.records.load import read_json
from tptune.records.run_dir import RunDir
from tptune.schedule import measured as ms
from tptune.schedule.simulate import Job, Node, Schedule, simulate
from tptune.schedule.wall_fit import load_table

IDLE_TIMEOUT_S = 30.0     # config/config.yaml's launcher.idle_timeout_s, for a config.json without it
MAX_GPUS = 1024           # data/config.schema.yaml's bound on gpus_per_node


@dataclass
class Prediction:
    run: str
    gpus: int
    tp_sizes: list[int]
    predicted_wall_s: float
    span_s: float                  # simulated: first session's start to the last one's end
    busy_s: float
    outside_s: float               # start-up and tail, outside the sessions' span
    outside_basis: str
    gaps_s: dict                   # edge kind -> seconds used
    start_s: dict                  # TP -> group start seconds used
    per_tp: dict                   # TP -> sessions, held_s, group_starts, first_start_s, last_end_s
    sessions: int
    extrapolated: list[str] = field(default_factory=list)   # one line per extrapolated TP
    # the smallest and largest factor an extrapolated TP's sessions were scaled by (TP 4 / TP 2 per op and kind)
    extrapolation_range: tuple[float, float] | None = None
    notes: list[str] = field(default_factory=list)
    measured_wall_s: float | None = None
    measured_span_s: float | None = None
    schedule: Schedule | None = None
    measured_tps: list[int] = field(default_factory=list)   # the TPs the run measured
    own_node: bool = False         # laid on the run's own node and TPs

    def what(self) -> str:
        """What kind of figure this is, in words: an extrapolation where a TP was not measured; else the run's
        own sessions laid on this node (on its own node: a check of the scheduler, which is given the run's
        own start-up, held times and gaps, not a prediction made before measuring)."""
        if self.extrapolation_range:
            lo, hi = self.extrapolation_range
            a, b = self.measured_tps[-2:]
            new = [t for t in self.tp_sizes if t > b]
            return (f"an extrapolation: TP {', '.join(map(str, new))} was not measured; its sessions are TP {b}'s, "
                    f"each scaled by its op's and kind's TP {b} / TP {a} seconds per member-round ({lo:.2f} to {hi:.2f})")
        if self.own_node:
            return ("the run's own sessions, start-up and gaps replayed on its own node: a check of the scheduler, "
                    "not a prediction made before measuring (tptune plan's, docs/wall-time.md)")
        return "the run's own sessions, start-up and gaps laid on this node, which it did not run on"

    def lines(self) -> list[str]:
        """The prediction and its breakdown, for a person."""
        out = [f"{self.run}: {'extrapolated' if self.extrapolation_range else 'predicted'} wall time on {self.gpus} "
               f"GPUs, TP {', '.join(map(str, self.tp_sizes))}: {self.predicted_wall_s:.0f} s"
               + (f" (measured on its own node: {self.measured_wall_s:.0f} s)" if self.measured_wall_s else ""),
               f"  {self.what()}"]
        for tp, d in self.per_tp.items():
            out.append(f"  TP {tp}: {d['sessions']} sessions, {d['held_s']:.1f} s held "
                       f"({d['group_starts']} group starts at {self.start_s.get(tp, 0.0):.1f} s), "
                       f"from {d['first_start_s']:.1f} s to {d['last_end_s']:.1f} s")
        out.append(f"  sessions' span {self.span_s:.1f} s, of which no session ran {self.span_s - self.busy_s:.1f} s")
        out.append("  gaps (median wait per kind, s): " + ", ".join(f"{k} {v:.1f}" for k, v in self.gaps_s.items()))
        out.append(f"  start-up and tail outside the span: {self.outside_s:.1f} s ({self.outside_basis})")
        out += [f"  extrapolated: {e}" for e in self.extrapolated]
        out += [f"  note: {n}" for n in self.notes]
        return out


def _doublings(lo: int, hi: int) -> int:
    n = 0
    while lo < hi:
        lo, n = lo * 2, n + 1
    return n


def fits(tp: int, gpus: int) -> bool:
    """Whether TP ``tp`` sessions fit a node of ``gpus`` GPUs: in aligned blocks of ``tp`` (schedule.simulate)."""
    return tp <= gpus and gpus % tp == 0


def default_tp_sizes(measured_tps: list[int], gpus: int) -> list[int]:
    """The run's TPs that fit the node; with two or more measured, the doublings above them that fit too."""
    tps = [t for t in measured_tps if fits(t, gpus)]
    if len(measured_tps) >= 2:
        t = measured_tps[-1] * 2
        while fits(t, gpus):
            tps.append(t)
            t *= 2
    return tps


def recorded_model(run: RunDir) -> ModelConfig | None:
    """The model and workload the run measured: its model.json (tptune model), else the settings its first
    session recorded; None where neither is there."""
    if run.model_json.is_file():
        rec, source = read_json(run.model_json), str(run.model_json)
    elif first := next(iter(run.session_jsons()), None):
        rec, source = (read_json(first).get("settings") or {}).get("model"), str(first)
    else:
        rec, source = None, ""
    if not isinstance(rec, dict) or not isinstance(rec.get("model"), dict):
        return None
    try:
        return parse_model(rec["model"], source, workload=rec.get("workload"))
    except ConfigError as exc:
        raise RecordError(f"{source}: the run's model does not read as a model: {exc}") from None


def _check_tp_sizes(tp_sizes: list[int], measured_tps: list[int], gpus: int, run: RunDir,
                    model: ModelConfig | None) -> None:
    for t in tp_sizes:
        if t < 1 or t & (t - 1):
            raise TptuneError(f"--tp-sizes: {t} is not a power of two")
        if not fits(t, gpus):
            raise TptuneError(f"--tp-sizes: TP {t} does not fit {gpus} GPUs (a TP {t} session takes an aligned "
                              f"block of {t} of the node's GPUs: give --gpus a multiple of {t})")
        problems = model.tp_problems(t) if model is not None else []
        if problems:
            raise TptuneError(f"--tp-sizes: {'; '.join(problems)} (the run's model, {model.source}: tptune "
                              "validate refuses this TP too)")
        if t in measured_tps:
            continue
        if t < measured_tps[-1]:
            raise TptuneError(f"{run}: TP {t} was not measured (measured: TP {', '.join(map(str, measured_tps))}); "
                              "only TPs above the largest measured are extrapolated")
        if len(measured_tps) < 2:
            raise TptuneError(f"{run}: TP {t} would be extrapolated from the TP {measured_tps[0]} sessions, but the "
                              "scaling from one TP to the next needs two measured TPs; give --tp-sizes "
                              f"{measured_tps[0]}")


def _per_member_round(sessions: list[ms.MeasuredSession], starts: dict) -> float | None:
    held = sum(x.held_s - _start_of(x, starts) for x in sessions)
    mr = sum(x.member_rounds for x in sessions)
    return held / mr if mr else None


def _start_of(x: ms.MeasuredSession, starts: dict) -> float:
    """The group start inside a session's held time (the run's median for its TP where unrecorded)."""
    if not x.group_starts:
        return 0.0
    return x.start_s if x.start_s is not None else min(starts.get(x.tp, 0.0), x.held_s)


def _ratio(sessions, op: str, kind: str, lo: int, hi: int, starts: dict) -> tuple[float, str]:
    """Seconds per member-round at ``hi`` over those at ``lo`` for ``op``'s ``kind``; else every op's of
    that kind; else 1."""
    for scope, pick in ((op, lambda x: x.op == op and x.kind == kind), ("all ops", lambda x: x.kind == kind)):
        a = _per_member_round([x for x in sessions if pick(x) and x.tp == lo], starts)
        b = _per_member_round([x for x in sessions if pick(x) and x.tp == hi], starts)
        if a and b:
            return b / a, scope
    return 1.0, "none measured"


def predict(run: RunDir, gpus: int | None = None, tp_sizes: list[int] | None = None,
            table: dict | None = None) -> Prediction:
    """The run's wall time on ``gpus`` GPUs (default: its own gpus_per_node) with ``tp_sizes`` (default:
    default_tp_sizes). TptuneError for what cannot be predicted, naming why."""
    cfg = ms.run_config(run)
    table = table if table is not None else load_table()
    node_gpus = int(cfg.get("gpus_per_node") or 8)
    gpus = int(gpus or node_gpus)
    if not 1 <= gpus <= MAX_GPUS:
        raise TptuneError(f"--gpus {gpus}: expected a number of GPUs from 1 to {MAX_GPUS} (one node; "
                          "gpus_per_node's bound)")
    sessions = ms.read_sessions(run)
    measured_tps = sorted({x.tp for x in sessions})
    model = recorded_model(run)
    notes = []
    if tp_sizes:
        tps = sorted(set(tp_sizes))
    else:
        tps = default_tp_sizes(measured_tps, gpus)
        for t in [t for t in tps if t not in measured_tps and model is not None and model.tp_problems(t)]:
            notes.append(f"TP {t} left out: {'; '.join(model.tp_problems(t))} (the run's model; tptune validate "
                         "refuses it)")
            tps = [u for u in tps if u < t]   # the doublings stop at the first TP the model cannot run
            break
    if not tps:
        raise TptuneError(f"{run}: no measured TP fits {gpus} GPUs (measured: TP {', '.join(map(str, measured_tps))}; "
                          f"a TP t session takes an aligned block of t GPUs, so the node's count must be a multiple "
                          "of t)")
    _check_tp_sizes(tps, measured_tps, gpus, run, model)

    starts = {t: ms.median_or([x.start_s for x in sessions if x.tp == t and x.group_starts and x.start_s],
                              None) for t in measured_tps}
    table_start = table["group_start_s"]
    for t in measured_tps:
        if starts[t] is None:
            starts[t] = table_start
            notes.append(f"TP {t}: the run started no worker group (one was warm), group start {table_start:.1f} s "
                         "from the committed runs' fit")

    measured_gaps = ms.gaps(sessions, node_gpus)
    gap_s = {k: measured_gaps.estimate(k, 0.0 if k == "first" else table["gaps_s"][k]) for k in ms.EDGES}

    wall = measured_wall_s(run)
    measured_span = ms.span(sessions)
    if wall is not None and wall >= measured_span:
        outside, basis = wall - measured_span, "the run's wall_s.txt minus its sessions' span"
        confirm_s = confirm_in_wall_s(run)
        if confirm_s:
            basis += f"; the confirm stage's {confirm_s:.0f} s included (it runs at the model TP on any node)"
    else:
        outside = table["outside_s"]
        basis = ("the committed runs' median: " + ("no wall_s.txt" if wall is None else
                 f"wall_s.txt ({wall:.0f} s) is shorter than the sessions' span ({measured_span:.0f} s): "
                 "they were measured by more than one invocation"))

    kept = [x for x in sessions if x.tp in tps]
    extrapolated = []
    top = measured_tps[-1]
    new_tps = [t for t in tps if t > top]
    if new_tps:
        lo = measured_tps[-2]
        base = [x for x in sessions if x.tp == top]
        grow = starts[top] / starts[lo] if starts[lo] else 1.0
        ratios = {}
        for x in base:
            ratios.setdefault((x.op, x.kind), _ratio(sessions, x.op, x.kind, lo, top, starts))
        scaled = []
        for t in new_tps:
            k = _doublings(top, t)
            scaled += [r ** k for r, _ in ratios.values()]
            starts[t] = starts[top] * grow ** k
            kept += [replace(x, name=_renamed(x.name, top, t), tp=t, started=x.started + k * 1e6, gpu_ids=None,
                             held_s=(x.held_s - _start_of(x, starts)) * ratios[(x.op, x.kind)][0] ** k,
                             start_s=0.0, group_starts=0) for x in base]
            extrapolated.append(
                f"TP {t}: {len(base)} sessions, those of TP {top} at its seconds per member-round x "
                + ", ".join(f"{op} {kind} {r ** k:.2f}" + ("" if scope == op else f" ({scope})")
                            for (op, kind), (r, scope) in sorted(ratios.items()))
                + f" (TP {top} / TP {lo} per op and kind" + (f", to the power {k}" if k > 1 else "") + "); "
                f"group start {starts[t]:.1f} s (TP {top}'s x TP {top} / TP {lo})")
        extrapolated.append(f"every op measured at TP {top} goes on to TP {', '.join(map(str, new_tps))} "
                            "(as decision.explore_all_tps makes it)")
        span = (min(scaled), max(scaled)) if scaled else None
    else:
        span = None
    deps = ms.dependencies(kept)
    jobs = []
    for i, x in enumerate(sorted(kept, key=lambda x: (x.started, x.name))):
        names, edge = deps[x.name]
        jobs.append(Job(x.name, x.tp, max(x.held_s - _start_of(x, starts), 0.0), names, gap_s[edge], priority=i))

    launcher = cfg.get("launcher") or {}
    warm = _warm_at_start(sessions, gpus) if gpus == node_gpus else ()
    if warm:
        notes.append("groups warm when the run began (no group start in its first session of TP "
                     + ", ".join(str(t) for _, t in warm) + "): warm in the replay too")
    node = Node(gpus=gpus, start_s=starts, launch_gap_s=gap_s["launch"],
                idle_timeout_s=float(launcher.get("idle_timeout_s") or IDLE_TIMEOUT_S),
                keep_idle_groups=bool(launcher.get("keep_idle_groups", True)), warm_at_start=warm)
    sched = simulate(jobs, node)
    return Prediction(run=str(run), gpus=gpus, tp_sizes=tps, predicted_wall_s=outside + sched.span_s,
                      span_s=sched.span_s, busy_s=sched.busy_s, outside_s=outside, outside_basis=basis,
                      gaps_s=gap_s, start_s={t: starts[t] for t in tps}, per_tp=sched.per_tp(),
                      sessions=len(jobs), extrapolated=extrapolated, extrapolation_range=span, notes=notes,
                      measured_wall_s=wall, measured_span_s=measured_span, schedule=sched,
                      measured_tps=list(measured_tps), own_node=gpus == node_gpus and tps == list(measured_tps))


def _warm_at_start(sessions: list[ms.MeasuredSession], gpus: int) -> tuple:
    """((gpus, tp), ...) of the groups the run found warm: its first session of a TP started none (and
    began before any group of that TP could have been started by the run itself)."""
    out = []
    for t in sorted({x.tp for x in sessions}):
        first = next(x for x in sessions if x.tp == t)
        if first.group_starts or any(y.tp == t and y.group_starts for y in sessions if y.started < first.started):
            continue
        ids = tuple(int(i) for i in first.gpu_ids) if first.gpu_ids else tuple(range(t))
        if max(ids) < gpus and len(ids) == t:
            out.append((ids, t))
    return tuple(out)


def _renamed(name: str, tp: int, new_tp: int) -> str:
    return name.replace(f"tp{tp}", f"tp{new_tp}", 1)
