"""Side-by-side measurement in alternating rounds: order, ratio intervals, adaptive stopping.

A *session* measures several settings (members) in one warm worker group, round after round
(A B C, B C A, C A B, ...: every member takes every position, so a slow drift or a warm-up effect
of a position does not favour one member). A round gives one value per member: the median over the
round's iterations of the slowest rank's fwd+bwd GPU time.

Noise model: what varies is the round, not the iteration (each round rebuilds the layer and its
userbuffers; the machine drifts between rounds). So two members are compared through their
per-round log ratios d_r = ln a_r - ln b_r, paired by round (both measured in round r of the same
session). The ratio is exp(mean d) and its interval exp(mean d +- t_{0.975, n-1} * sd(d) / sqrt(n)).
Members from different sessions are compared unpaired (Welch), which carries the drift between
sessions into the interval; decisions never need that except across TP sizes.

A comparison *clears the margin* m when its interval lies entirely on one side:
    hi < 1 - m        a is faster              (outcome -1)
    lo > 1 + m        a is slower              (outcome +1)
    1-t <= lo, hi <= 1+t   equivalent: a tie    (outcome 0, resolved; t the tie margin, m unless given)
    otherwise         undecided: more rounds, or at the budget's end a tie (outcome 0, unresolved)
Futility stop (timing.futility): an undecided comparison whose interval, at its present mean and
spread, could not clear by the round budget either (could_clear) gets no more rounds: it ends the
undecided tie it would have ended at the budget, rounds earlier. Replayed on the 236 recorded GPU
sessions in results/ (benchmarks/replay_stopping.py), it measured 17% fewer member-rounds; of 500
comparisons 3 that had cleared to one side by the budget ended undecided instead, 6 that had cleared
as ties ended as undecided ties (the same pick: the cheaper setting), 3 cleared that had not.
A search step between two values of one knob wins at a smaller m than it ties at (decision.step_margin
against decision.noise_floor, settings.step_margins): see config/config.yaml for why.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tptune.records.measured_point import MeasuredPoint

# Two-sided 97.5% quantiles of Student's t for df = 1..30 (then the normal 1.96).
_T975 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
         2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
         2.052, 2.048, 2.045, 2.042]


def t975(df: float) -> float:
    d = int(math.floor(df + 1e-9))  # a Welch df that is an integer up to rounding (5.999...) is that integer
    if d < 1:
        return math.inf
    return _T975[d - 1] if d <= len(_T975) else 1.96


def rotation(members: list, r: int) -> list:
    """The order of round ``r``: the members rotated by r."""
    if not members:
        return []
    k = r % len(members)
    return list(members[k:]) + list(members[:k])


@dataclass(frozen=True)
class Ratio:
    """a / b with its 95% interval over ``rounds`` rounds; ``paired``: rounds of one session."""
    ratio: float
    lo: float
    hi: float
    rounds: int
    paired: bool

    def outcome(self, margin: float, tie_margin: float | None = None) -> tuple[int, bool]:
        """(-1 a faster | +1 a slower | 0 tie, resolved?): a side wins beyond ``margin``; a resolved tie
        lies within ``tie_margin`` (default: ``margin``) (module doc)."""
        tie = margin if tie_margin is None else tie_margin
        if self.hi < 1 - margin:
            return -1, True
        if self.lo > 1 + margin:
            return 1, True
        if self.lo >= 1 - tie and self.hi <= 1 + tie:
            return 0, True
        return 0, False

    def to_dict(self) -> dict:
        return {"ratio": _r(self.ratio), "lo": _r(self.lo), "hi": _r(self.hi), "rounds": self.rounds,
                "paired": self.paired}

    @classmethod
    def from_dict(cls, d: dict | None) -> "Ratio | None":
        """The Ratio of a recorded comparison (to_dict); None where it has no finite interval."""
        if not d or None in (d.get("ratio"), d.get("lo"), d.get("hi")):
            return None
        return cls(d["ratio"], d["lo"], d["hi"], d["rounds"], d["paired"])


def _r(x: float):
    return None if x is None or not math.isfinite(x) else round(x, 5)


def paired_log_ratios(a: dict[int, float], b: dict[int, float]) -> list[float]:
    """Per-round log ratios of a to b over the rounds both have ({round id: value}), in round order."""
    return [math.log(a[r]) - math.log(b[r]) for r in sorted(set(a) & set(b)) if a[r] > 0 and b[r] > 0]


def paired_ratio(a: dict[int, float], b: dict[int, float]) -> Ratio | None:
    """Ratio of a to b over the rounds both have ({round id: value}); None without a common round."""
    return log_ratio_interval(paired_log_ratios(a, b))


def log_ratio_interval(ds: list[float]) -> Ratio | None:
    """The paired Ratio of per-round log ratios ``ds``: exp of their mean with its 95% Student interval;
    None without one."""
    if not ds:
        return None
    mean = statistics.fmean(ds)
    if len(ds) < 2:
        return Ratio(math.exp(mean), 0.0, math.inf, len(ds), True)
    half = t975(len(ds) - 1) * statistics.stdev(ds) / math.sqrt(len(ds))
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(ds), True)


def unpaired_ratio(a: list[float], b: list[float]) -> Ratio | None:
    """Ratio of two independent series (Welch on the logs); None when one is empty."""
    la, lb = [math.log(x) for x in a if x > 0], [math.log(x) for x in b if x > 0]
    if not la or not lb:
        return None
    mean = statistics.fmean(la) - statistics.fmean(lb)
    if len(la) < 2 or len(lb) < 2:
        return Ratio(math.exp(mean), 0.0, math.inf, min(len(la), len(lb)), False)
    va, vb = statistics.variance(la) / len(la), statistics.variance(lb) / len(lb)
    se = math.sqrt(va + vb)
    if se == 0:
        return Ratio(math.exp(mean), math.exp(mean), math.exp(mean), min(len(la), len(lb)), False)
    df = (va + vb) ** 2 / ((va ** 2 / (len(la) - 1) if va else 0) + (vb ** 2 / (len(lb) - 1) if vb else 0) or 1e-300)
    half = t975(df) * se
    return Ratio(math.exp(mean), math.exp(mean - half), math.exp(mean + half), min(len(la), len(lb)), False)


def point_rounds(point: MeasuredPoint | None, metric: str = "total_ms") -> dict[int, float]:
    """{round id: value} of a measured point (empty for a failed or missing point or one without rounds)."""
    return {} if point is None else point.rounds(metric)


def ratio_of(a: MeasuredPoint, b: MeasuredPoint, metric: str = "total_ms") -> Ratio | None:
    """a / b: paired when both come from one session, else unpaired; None without rounds."""
    ra, rb = point_rounds(a, metric), point_rounds(b, metric)
    if not ra or not rb:
        return None
    same = a.session is not None and a.session == b.session
    if same and set(ra) & set(rb):
        return paired_ratio(ra, rb)
    return unpaired_ratio(list(ra.values()), list(rb.values()))


def center(point: MeasuredPoint | None, metric: str = "total_ms") -> float:
    """Geometric mean of a point's round values (what ratios are built from); inf if none."""
    vals = [v for v in point_rounds(point, metric).values() if v > 0]
    return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else math.inf


FUTILITY_MIN_ROUNDS = 3      # two rounds' spread (one degree of freedom) says too little to give up on
_Z975 = 1.96


def could_clear(r: Ratio, margin: float, tie_margin: float | None, rounds: int) -> bool:
    """Could this comparison still clear (Ratio.outcome resolved) by ``rounds`` rounds, were its mean
    and per-round spread to hold? The projection takes the normal quantile, narrower than Student's t
    at that many rounds, so in doubt the comparison goes on. True below FUTILITY_MIN_ROUNDS rounds,
    without a finite interval, or with no rounds left to add."""
    if r.rounds < FUTILITY_MIN_ROUNDS or r.rounds >= rounds or not (0 < r.lo <= r.hi < math.inf):
        return True
    mean = math.log(r.ratio)
    sd = (math.log(r.hi) - math.log(r.lo)) / 2 * math.sqrt(r.rounds) / t975(r.rounds - 1)
    half = _Z975 * sd / math.sqrt(rounds)
    projected = Ratio(r.ratio, math.exp(mean - half), math.exp(mean + half), rounds, r.paired)
    return projected.outcome(margin, tie_margin)[1]


@dataclass
class SessionState:
    """Where a session stands after some rounds: the leader among the contenders and, for every
    other contender, its ratio to the leader and whether that clears the margin; ``futile``: the
    unresolved ones the round budget could not clear either (could_clear)."""
    leader: str | None
    ratios: dict[str, Ratio | None]
    resolved: dict[str, bool]
    losers: list[str]
    futile: list[str] = field(default_factory=list)

    @property
    def unresolved(self) -> list[str]:
        return [c for c, ok in self.resolved.items() if not ok]

    @property
    def open(self) -> list[str]:
        """Unresolved contenders that more rounds could still clear."""
        return [c for c in self.unresolved if c not in self.futile]


def session_state(points: dict[str, MeasuredPoint], contenders: list[str], margin: float,
                  leader_among: list[str] | None = None, tie_margin: float | None = None,
                  budget: int | None = None) -> SessionState:
    """Leader = the contender with the smallest centre (among ``leader_among`` when given and any of
    them has rounds: the contenders still measured, so a dropped one cannot lead on stale rounds);
    each other contender against it (Ratio.outcome(margin, tie_margin)). ``budget``: the round
    budget; an unresolved contender it could not clear either is futile (none without a budget)."""
    ok = [c for c in contenders if point_rounds(points.get(c))]
    if not ok:
        return SessionState(None, {}, {}, [])
    pool = [c for c in ok if leader_among is None or c in leader_among] or ok
    leader = min(pool, key=lambda c: center(points[c]))
    ratios, resolved, losers, futile = {}, {}, [], []
    for c in ok:
        if c == leader:
            continue
        r = ratio_of(points[c], points[leader])
        ratios[c] = r
        out, done = r.outcome(margin, tie_margin) if r else (0, False)
        resolved[c] = done
        if done and out > 0:
            losers.append(c)
        if not done and r is not None and budget is not None and not could_clear(r, margin, tie_margin, budget):
            futile.append(c)
    return SessionState(leader, ratios, resolved, losers, futile)


def should_stop(state: SessionState, rounds_done: int, min_rounds: int, max_rounds: int) -> tuple[bool, str]:
    """Stop once every contender is resolved against the leader (after min_rounds), at max_rounds, or
    once what is unresolved is futile (the budget could not clear it either)."""
    if rounds_done < min_rounds:
        return False, ""
    if not state.unresolved:
        return True, f"resolved after {rounds_done} rounds"
    if rounds_done >= max_rounds:
        return True, f"round budget ({max_rounds}) spent; undecided: {', '.join(state.unresolved)}"
    if not state.open:
        return True, (f"futile after {rounds_done} rounds (the budget of {max_rounds} could not clear them "
                      f"either); undecided: {', '.join(state.unresolved)}")
    return False, ""


def measured_next(state: SessionState, active: list[str], references: set[str] | frozenset = frozenset(),
                  always: tuple | list | set = ()) -> list[str]:
    """The members a session's next round measures, once min_rounds are done: the leader, the open
    contenders, ``always`` and the references (no overlap, the bound: every round, so every ratio to
    them is paired over all the session's rounds). Resolved and futile contenders and non-contenders
    have said what they had to say."""
    keep = set(state.open) | {state.leader} | set(always) | set(references)
    return [c for c in active if c in keep]


def drift(values: list[float]) -> float | None:
    """max/min - 1 of a canary's values over the run."""
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return (max(vals) / min(vals) - 1) if len(vals) >= 2 else None
