"""A measured run's sessions as the scheduler sees them, read from sessions/**/session.json (and, for a
session that started a worker group, its members' run.json for the start's seconds).

The workflow's order (rules/search.smk, rules/common.smk): within one (op, TP, dimension) the search
steps run one after the other; the TP point after every step of its (op, TP); the op's next TP (its TP
decision's checkpoint) after that point; the layer stage of every TP once every op's search is over
(``searches_done``), so after every TP point; the packed block sessions (layer/tp<N>/pack<T>, search.packed)
after the decisions, so after every layer session. ``dependencies`` gives each session the sessions it
waits for and the kind of bookkeeping between them (``EDGES``); ``gaps`` measures that bookkeeping in a
run: from the moment a session could have started (its dependencies ended and its GPUs were free) to
its ``started``.
"""
from __future__ import annotations

import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

from tptune.errors import TptuneError
from tptune.records.run_dir import RunDir
from tptune.records.sessions import read_point

# The bookkeeping before a session: the run's first sessions (none), a search step after the previous
# step (its search-step checkpoint), a TP point after its searches (search results, tp_results), an op's
# next TP after the previous TP's point (tp-point, its analysis, the TP decision), the layer stage after
# every point (every op's decision chain, searches_done); "launch": Snakemake starting a waiting session
# once GPUs free up.
EDGES = ("first", "step", "point", "next_tp", "block", "launch")
# A wait longer than this between sessions is not bookkeeping: the session was measured by another
# invocation (a layer stage measured on a later lease, a run carried on), which no gap should stand for.
MAX_GAP_S = 120.0

_STEP = re.compile(r"^(?P<op>[^/]+)/tp(?P<tp>\d+)/(?P<dim>[^/]+)/step(?P<step>\d+)$")
_POINT = re.compile(r"^(?P<op>[^/]+)/tp(?P<tp>\d+)/point$")
_LAYER = re.compile(r"^layer/tp(?P<tp>\d+)$")
_PACKED = re.compile(r"^layer/tp(?P<tp>\d+)/pack(?P<capacity>\d+)$")


@dataclass(frozen=True)
class MeasuredSession:
    name: str                     # relative to sessions/: "qkv/tp2/knobs/step0", "qkv/tp2/point", "layer/tp2"
    op: str                       # "layer" for a block session
    tp: int
    kind: str                     # steps | points | blocks
    dim: str | None
    step: int | None
    started: float
    held_s: float                 # what the session held its GPUs for (session.json held_s, else wall_s)
    start_s: float | None         # of held_s, the worker-group start-up (None: started one, seconds unknown)
    group_starts: int
    members: int
    rounds: int
    gpu_ids: tuple[str, ...] | None

    @property
    def end(self) -> float:
        return self.started + self.held_s

    @property
    def member_rounds(self) -> int:
        return self.members * max(self.rounds, 1)


def parse_name(name: str) -> tuple[str, int, str, str | None, int | None]:
    """(op, tp, kind, dim, step) of a session's name; ValueError for a name the workflow never makes."""
    if m := _STEP.match(name):
        return m["op"], int(m["tp"]), "steps", m["dim"], int(m["step"])
    if m := _POINT.match(name):
        return m["op"], int(m["tp"]), "points", None, None
    if m := _LAYER.match(name):
        return "layer", int(m["tp"]), "blocks", None, None
    if m := _PACKED.match(name):     # a packed block session (search.packed), costed as a block
        return "layer", int(m["tp"]), "blocks", None, None
    raise ValueError(f"{name}: not a session name (<op>/tp<N>/<dim>/step<k>, <op>/tp<N>/point, layer/tp<N> or "
                     "layer/tp<N>/pack<T>)")


def _start_seconds(folder: Path, rec: dict) -> float | None:
    """Seconds the session's members spent starting worker groups (their run.json attempts' connect_s
    where server_started), or None where the record does not say."""
    total, found = 0.0, False
    for rel in (rec.get("runs") or {}).values():
        try:
            point = read_point(folder / rel)
        except (OSError, ValueError):
            continue
        for att in point.attempts:
            if att.get("server_started") and att.get("connect_s") is not None:
                total, found = total + float(att["connect_s"]), True
    return total if found else None


def read_sessions(run: RunDir) -> list[MeasuredSession]:
    """Every recorded session of ``run``, in start order. TptuneError names the first session.json that
    cannot be replayed (no ``started`` or held time: recorded before sessions kept them)."""
    out = []
    for sj in run.session_jsons():
        name = run.session_name(sj.parent)
        try:
            rec = json.loads(sj.read_text())
        except (OSError, ValueError) as exc:
            raise TptuneError(f"{sj}: not a readable session record ({exc})") from None
        held = rec.get("held_s", rec.get("wall_s"))
        if rec.get("started") is None or held is None:
            raise TptuneError(f"{sj}: no 'started' or 'held_s'/'wall_s' (a session recorded before sessions kept "
                              "their start and held time): the run cannot be laid on a timeline")
        try:
            op, tp, kind, dim, step = parse_name(name)
        except ValueError as exc:
            raise TptuneError(f"{sj}: {exc}") from None
        gs = int(rec.get("group_starts") or 0)
        ids = (rec.get("held") or {}).get("ids")
        out.append(MeasuredSession(
            name=name, op=op, tp=int(rec.get("tp", tp)), kind=kind, dim=dim, step=step,
            started=float(rec["started"]), held_s=float(held),
            start_s=(_start_seconds(sj.parent, rec) if gs else 0.0), group_starts=gs,
            members=len(rec.get("members") or rec.get("runs") or ()), rounds=int(rec.get("rounds") or 0),
            gpu_ids=tuple(str(i) for i in ids) if ids else None))
    if not out:
        raise TptuneError(f"{run.sessions}: no session.json (nothing measured yet)")
    return sorted(out, key=lambda x: (x.started, x.name))


def dependencies(sessions: list[MeasuredSession]) -> dict[str, tuple[tuple[str, ...], str]]:
    """Per session name: (the sessions it waits for, the edge kind of the bookkeeping before it)."""
    by_op_tp: dict[tuple[str, int], list[MeasuredSession]] = {}
    for x in sessions:
        by_op_tp.setdefault((x.op, x.tp), []).append(x)
    points = {(x.op, x.tp): x.name for x in sessions if x.kind == "points"}
    tps_of = {op: sorted({t for (o, t) in by_op_tp if o == op}) for op, _ in by_op_tp}

    def previous_point(op: str, tp: int) -> tuple[str, ...]:
        lower = [t for t in tps_of[op] if t < tp and (op, t) in points]
        return (points[(op, lower[-1])],) if lower else ()

    deps: dict[str, tuple[tuple[str, ...], str]] = {}
    for (op, tp), group in by_op_tp.items():
        if op == "layer":
            continue
        last_steps = []
        dims: dict[str, list[MeasuredSession]] = {}
        for x in group:
            if x.kind == "steps":
                dims.setdefault(x.dim, []).append(x)
        for steps in dims.values():
            steps.sort(key=lambda x: x.step)
            prev = previous_point(op, tp)
            deps[steps[0].name] = (prev, "next_tp" if prev else "first")
            for a, b in zip(steps, steps[1:]):
                deps[b.name] = ((a.name,), "step")
            last_steps.append(steps[-1].name)
        if (op, tp) in points:
            if last_steps:
                deps[points[(op, tp)]] = (tuple(last_steps), "point")
            else:
                prev = previous_point(op, tp)
                deps[points[(op, tp)]] = (prev, "next_tp" if prev else "first")
    all_points = tuple(sorted(points.values()))
    blocks = tuple(sorted(x.name for x in sessions if _LAYER.match(x.name)))
    for x in sessions:
        if _PACKED.match(x.name):      # after the decisions, so after every layer session
            deps[x.name] = (blocks or all_points, "block" if blocks or all_points else "first")
        elif x.op == "layer":
            deps[x.name] = (all_points, "block" if all_points else "first")
    return deps


def _shares_gpus(a: MeasuredSession, b: MeasuredSession, gpus: int) -> bool:
    if a.gpu_ids is not None and b.gpu_ids is not None:
        return bool(set(a.gpu_ids) & set(b.gpu_ids))
    return a.tp + b.tp > gpus      # ids not recorded: only a node too small for both says they shared


@dataclass
class Gaps:
    """The measured waits per edge kind (EDGES): ``waits`` where the dependencies were the last to be
    ready (the bookkeeping itself; "launch": where the GPUs were, Snakemake starting the next job), and
    ``bounds`` where the GPUs freed later: the wait from the dependencies is then only a bound above the
    bookkeeping (it ran while the session waited for its GPUs)."""
    waits: dict[str, list[float]]
    bounds: dict[str, list[float]]

    def estimate(self, kind: str, default: float) -> float:
        """The median wait of ``kind``; without one, ``default`` kept under the median bound."""
        if self.waits[kind]:
            return statistics.median(self.waits[kind])
        return min(default, statistics.median(self.bounds[kind])) if self.bounds[kind] else default


def gaps(sessions: list[MeasuredSession], gpus: int) -> Gaps:
    """A session's wait is its start minus the later of its dependencies' end (the run's first start
    for none) and its GPUs' freeing (Gaps). Waits over MAX_GAP_S are left out (another invocation
    measured the session)."""
    deps = dependencies(sessions)
    by_name = {x.name: x for x in sessions}
    t0 = min(x.started for x in sessions)
    out = Gaps({k: [] for k in EDGES}, {k: [] for k in EDGES})
    for x in sessions:
        names, edge = deps[x.name]
        ready = max((by_name[d].end for d in names), default=t0)
        free = max((y.end for y in sessions if y is not x and y.end <= x.started + 1e-6
                    and _shares_gpus(x, y, gpus)), default=t0)
        if ready >= free:
            _keep(out.waits[edge], x.started - ready)
        else:
            _keep(out.waits["launch"], x.started - free)
            _keep(out.bounds[edge], x.started - ready)
    return out


def _keep(samples: list[float], wait: float) -> None:
    if -1.0 < wait <= MAX_GAP_S:       # a little below 0: clocks of two processes
        samples.append(max(wait, 0.0))


def span(sessions: list[MeasuredSession]) -> float:
    """From the first session's start to the last one's end."""
    return max(x.end for x in sessions) - min(x.started for x in sessions)


def median_or(values: list[float], default: float | None) -> float | None:
    return statistics.median(values) if values else default


def run_config(run: RunDir) -> dict:
    try:
        return json.loads(run.config_json.read_text())
    except FileNotFoundError:
        raise TptuneError(f"{run.config_json}: no such file (expected the run's config.json)") from None
    except (OSError, ValueError) as exc:
        raise TptuneError(f"{run.config_json}: not a run's config.json ({exc})") from None
