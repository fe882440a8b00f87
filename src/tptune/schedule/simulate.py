"""List scheduling of a run's sessions onto a node of G GPUs, as the workflow and the GPU pool run them.

A session of TP t holds an aligned block of t GPUs (0-1, 2-3, ... for t = 2; the pool's own choice,
measure.gpupool), so TP 2 sessions run on G/2 pairs at once, TP 4 on G/4 quads, TP 8 on all eight. A
session may start once every session it depends on has ended and its bookkeeping gap has passed (the
checkpoint jobs Snakemake runs between them), and, on a block, once the block's GPUs are free plus the
launch gap (Snakemake starting the next job). Among the sessions that can start, the earliest start wins
(ties: the given priority); nothing is reserved, so a TP 4 session waits while TP 2 sessions keep a pair
busy, as Snakemake's scheduler does with ``--resources gpus=G``.

A worker group of TP t stays warm on its block for ``idle_timeout_s`` after its last session (the
launcher's idle timeout); a session on a block without a warm group of its TP first starts one and pays
``start_s[t]``. Groups on overlapping GPUs are retired when a new one starts unless
``keep_idle_groups`` (the launcher's setting); ``warm_at_start`` are groups an earlier run left warm.
Values only: nothing is read or written here.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Job:
    """One session to place: ``seconds`` it holds its GPUs once its worker group is warm."""
    name: str
    tp: int
    seconds: float
    deps: tuple[str, ...] = ()
    gap_s: float = 0.0            # from the last dependency's end (or time 0) to the earliest start
    priority: float = 0.0         # lower first among equal starts (the measured start order)


@dataclass(frozen=True)
class Node:
    gpus: int
    start_s: dict                 # TP -> seconds to start a worker group of that TP
    launch_gap_s: float = 0.0     # from a block's GPUs freeing to the next session starting on them
    idle_timeout_s: float = 30.0
    keep_idle_groups: bool = True
    warm_at_start: tuple = ()     # ((gpus, tp), ...): groups already warm at time 0 (left by an earlier run)


@dataclass(frozen=True)
class Placed:
    name: str
    tp: int
    start: float
    end: float
    gpus: tuple[int, ...]
    group_start: bool


@dataclass
class Schedule:
    placed: dict[str, Placed] = field(default_factory=dict)

    @property
    def span_s(self) -> float:
        """From time 0 to the last session's end."""
        return max((p.end for p in self.placed.values()), default=0.0)

    @property
    def busy_s(self) -> float:
        """Time in which at least one session ran."""
        busy, end = 0.0, None
        for p in sorted(self.placed.values(), key=lambda p: p.start):
            if end is None or p.start >= end:
                busy, end = busy + p.end - p.start, p.end
            elif p.end > end:
                busy, end = busy + p.end - end, p.end
        return busy

    def per_tp(self) -> dict[int, dict]:
        """Per TP: sessions, the seconds they held (group starts included), group starts, first start, last end."""
        out: dict[int, dict] = {}
        for p in self.placed.values():
            d = out.setdefault(p.tp, {"sessions": 0, "held_s": 0.0, "group_starts": 0,
                                      "first_start_s": p.start, "last_end_s": p.end})
            d["sessions"] += 1
            d["held_s"] += p.end - p.start
            d["group_starts"] += int(p.group_start)
            d["first_start_s"] = min(d["first_start_s"], p.start)
            d["last_end_s"] = max(d["last_end_s"], p.end)
        return dict(sorted(out.items()))


def blocks(gpus: int, tp: int) -> list[tuple[int, ...]]:
    if tp > gpus or gpus % tp:
        raise ValueError(f"a TP {tp} session does not fit a node of {gpus} GPUs in aligned blocks")
    return [tuple(range(i, i + tp)) for i in range(0, gpus, tp)]


def simulate(jobs: list[Job], node: Node) -> Schedule:
    """Place every job (module doc). Raises ValueError on an unknown or cyclic dependency, or a TP the
    node cannot hold."""
    by_name = {j.name: j for j in jobs}
    if len(by_name) != len(jobs):
        raise ValueError("job names must be distinct")
    for j in jobs:
        missing = [d for d in j.deps if d not in by_name]
        if missing:
            raise ValueError(f"{j.name} depends on {missing}, which are not among the jobs")
        if j.tp not in node.start_s:
            raise ValueError(f"{j.name}: no group start cost for TP {j.tp} (node.start_s has {sorted(node.start_s)})")
        blocks(node.gpus, j.tp)
    free = [0.0] * node.gpus                 # when each GPU's last placed session ends
    warm: dict[tuple, float] = {(tuple(g), t): 0.0 for g, t in node.warm_at_start}   # (gpus, tp) -> its last end
    sched = Schedule()
    todo = dict(by_name)
    while todo:
        best = None
        for j in todo.values():
            if any(d not in sched.placed for d in j.deps):
                continue
            ready = max((sched.placed[d].end for d in j.deps), default=0.0) + j.gap_s
            for blk in blocks(node.gpus, j.tp):
                gpu_free = max(free[g] for g in blk)
                start = max(ready, gpu_free + (node.launch_gap_s if gpu_free > 0 else 0.0))
                last = warm.get((blk, j.tp))
                is_warm = last is not None and start - last <= node.idle_timeout_s
                key = (start, not is_warm, j.priority, blk)
                if best is None or key < best[0]:
                    best = (key, j, blk, is_warm)
        if best is None:
            raise ValueError(f"cyclic dependencies among {sorted(todo)}")
        (start, _, _, blk), j, _, is_warm = best
        cost = 0.0 if is_warm else float(node.start_s[j.tp])
        end = start + cost + j.seconds
        if not is_warm and not node.keep_idle_groups:
            for key in [k for k in warm if set(k[0]) & set(blk)]:
                del warm[key]
        warm[(blk, j.tp)] = end
        for g in blk:
            free[g] = end
        sched.placed[j.name] = Placed(j.name, j.tp, start, end, blk, not is_warm)
        del todo[j.name]
    return sched
