"""Overlap efficiency: the share of the exposed communication a setting hides.

    e = (none - chosen) / (none - bound)

from the paired per-round values of one session: over the rounds in which none, chosen and bound were
all measured, D1_r = none_r - chosen_r and D2_r = none_r - bound_r; e = mean(D1) / mean(D2) (a ratio
estimator), its 95% interval from the linearised residuals z_r = D1_r - e D2_r: se = sd(z) / (sqrt(n)
mean(D2)), e +- t_{n-1} se.

Each op is capped at its bound: a chosen setting below its bound within the noise reaches the bound
(e counts as 1 in sums, and is worded "at the bound", never as a percentage: the estimate lies above
100% and a printed 100% would hide that); below it beyond the noise is a bound fault (stats.bound) and shown as a fault, never a
percentage. A chosen setting at or slower than no overlap hides nothing (0%). An estimate whose interval
covers every share from none to all is no figure: it is shown as undecided, with no percentage for its ends. The model-level figure sums
the capped ops round by round: a capped op contributes its exposed time as hidden (D1_r := D2_r), a
faulted op is left out and named.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field

from tptune.records.measured_point import MeasuredPoint
from tptune.stats.rounds import point_rounds, t975
from tptune.stats.bound import bound_vs, is_fault


@dataclass
class Efficiency:
    value: float | None          # capped to [0, 1]; None for a fault or when nothing can be said
    lo: float | None
    hi: float | None
    rounds: int
    raw: float | None = None     # the uncapped estimate
    exposed_ms: float | None = None
    hidden_ms: float | None = None   # capped
    capped: str | None = None    # "at bound" | "at none" | None
    fault: dict | None = None
    why: str | None = None
    ops: list = field(default_factory=list)   # model level: the ops summed
    left_out: list = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {k: (round(v, 5) if isinstance(v, float) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, d: dict) -> "Efficiency":
        return cls(**d)

    def shown(self) -> str:
        """What a report prints: a percentage with its interval, or the fault, or why there is none."""
        if self.fault:
            return f"bound fault (bound / chosen {self.fault['ratio']:.3f} [{self.fault['lo']:.3f}, {self.fault['hi']:.3f}])"
        if self.why == "no overlap chosen":
            return "0% (no overlap chosen)"
        if self.value is None:
            return f"– ({self.why})" if self.why else "–"
        if self.capped == "at bound":
            low = f"; lower limit {100 * self.lo:.0f}%" if self.lo is not None and self.lo < 1 else ""
            return f"at the bound (the chosen setting reads at or below it, within the noise{low})"
        if self.undecided():
            return f"undecided ({self.undecided()})"
        iv = f" [{100 * self.lo:.0f}, {100 * self.hi:.0f}]" if self.lo is not None else ""
        cap = f", {self.capped}" if self.capped else ""
        return f"{100 * self.value:.0f}%{iv}{cap}"

    def undecided(self) -> str | None:
        """Why the estimate is no figure, or None: its interval covers every share from none to all."""
        if self.fault or self.value is None or self.lo is None or self.hi is None or self.capped == "at bound":
            return None
        if self.lo <= 0 and self.hi >= 1:
            return (f"{self.rounds} rounds: the 95% interval covers every share from none to all, so the noise cannot "
                    "tell how much is hidden")
        return None

    def hides(self) -> str:
        """The hiding rule's words: "hides 80% [53, 100] of exposed communication", or that it reaches the bound."""
        if self.undecided():   # the TP rule decides on the estimate: say it, and that the noise cannot support it
            return (f"hides {100 * self.value:.0f}% of exposed communication by its estimate, which the noise "
                    f"cannot support ({self.undecided()})")
        if self.capped == "at bound" and not self.fault:
            return f"hides all exposed communication: {self.shown()}"
        return f"hides {self.shown()} of exposed communication"


def _ratio_interval(d1: list[float], d2: list[float]) -> tuple[float, float | None, float | None]:
    n = len(d1)
    m1, m2 = statistics.fmean(d1), statistics.fmean(d2)
    e = m1 / m2
    if n < 2:
        return e, None, None
    z = [a - e * b for a, b in zip(d1, d2)]
    se = statistics.stdev(z) / (math.sqrt(n) * m2)
    half = t975(n - 1) * se
    return e, e - half, e + half


def _clip(x: float | None) -> float | None:
    return None if x is None else min(1.0, max(0.0, x))


def paired_rounds(none: MeasuredPoint, chosen: MeasuredPoint, bound: MeasuredPoint) -> list[tuple[float, float, float]]:
    """(none, chosen, bound) of every round the three share, in round order."""
    rn, rc, rb = point_rounds(none), point_rounds(chosen), point_rounds(bound)
    return [(rn[r], rc[r], rb[r]) for r in sorted(set(rn) & set(rc) & set(rb))]


def op_efficiency(none: MeasuredPoint | None, chosen: MeasuredPoint | None, bound: MeasuredPoint | None) -> Efficiency:
    """The efficiency of one op's chosen setting (module doc). ``bound`` after its burn-in."""
    if not (none and chosen and bound):
        return Efficiency(None, None, None, 0, why="no bound measured")
    if chosen.case == none.case:
        return Efficiency(0.0, 0.0, 0.0, 0, raw=0.0, capped=None, why="no overlap chosen")
    rows = paired_rounds(none, chosen, bound)
    if len({p.session for p in (none, chosen, bound)}) != 1 or not rows:
        return Efficiency(None, None, None, 0, why="not measured in one session")
    d1 = [n - c for n, c, _ in rows]
    d2 = [n - b for n, _, b in rows]
    exposed = statistics.fmean(d2)
    if exposed <= 0:
        return Efficiency(None, None, None, len(rows), exposed_ms=exposed,
                          why="the bound is not below no overlap: no exposed communication measured")
    e, lo, hi = _ratio_interval(d1, d2)
    fault_r = bound_vs(bound, chosen)
    if is_fault(fault_r):
        return Efficiency(None, None, None, len(rows), raw=e, exposed_ms=exposed,
                          fault={**fault_r.to_dict(), "bound": bound.case, "above": chosen.case})
    capped = "at bound" if e > 1 else "at none" if e < 0 else None
    return Efficiency(_clip(e), _clip(lo), _clip(hi), len(rows), raw=e, exposed_ms=exposed,
                      hidden_ms=exposed * _clip(e), capped=capped)


def median_efficiency(none_ms: float, chosen_ms: float, bound_ms: float) -> Efficiency:
    """The efficiency from one median each, where no paired rounds exist (a bound estimated from other
    sessions): capped as op_efficiency caps, but without an interval a setting that reads below the bound
    cannot be told from one at it, so it gets no figure."""
    exposed = none_ms - bound_ms
    if exposed <= 0:
        return Efficiency(None, None, None, 0, exposed_ms=exposed,
                          why="the bound is not below no overlap: no exposed communication")
    e = (none_ms - chosen_ms) / exposed
    if e > 1:
        return Efficiency(None, None, None, 0, raw=e, exposed_ms=exposed, why="reads below the bound, by medians")
    return Efficiency(_clip(e), None, None, 0, raw=e, exposed_ms=exposed, hidden_ms=exposed * _clip(e),
                      capped="at none" if e < 0 else None)


def _op_columns(none: MeasuredPoint, chosen: MeasuredPoint, bound: MeasuredPoint, eff: Efficiency) -> tuple[list[float], list[float]]:
    """(D1, D2) of one op over its shared rounds; a capped op hides its exposed time (D1 := D2), an op
    that chose no overlap hides nothing (D1 := 0)."""
    if chosen.case == none.case:
        rn, rb = point_rounds(none), point_rounds(bound)
        d2 = [rn[r] - rb[r] for r in sorted(set(rn) & set(rb))]
        return [0.0] * len(d2), d2
    rows = paired_rounds(none, chosen, bound)
    d2 = [n - b for n, _, b in rows]
    return (list(d2) if eff.capped == "at bound" else [n - c for n, c, _ in rows]), d2


def model_efficiency(per_op: dict[str, tuple[MeasuredPoint, MeasuredPoint, MeasuredPoint]]) -> Efficiency:
    """The capped efficiency of the summed ops: {op: (none, chosen, bound)}. e = sum_i mean(D1_i) /
    sum_i mean(D2_i) over every op's own shared rounds (capped as in _op_columns); the ops' sessions are
    independent, so the variance of the linearised residual means adds over ops (delta method), with
    Welch-Satterthwaite degrees of freedom. A faulted op, or one without a figure, is left out and named."""
    cols, names, left = [], [], []
    for op, (none, chosen, bound) in per_op.items():
        if not (none and chosen and bound):
            left.append({"op": op, "why": "no bound measured"})
            continue
        eff = op_efficiency(none, chosen, bound)
        if eff.fault or (eff.value is None and eff.why != "no overlap chosen"):
            left.append({"op": op, "why": "bound fault" if eff.fault else eff.why})
            continue
        d1, d2 = _op_columns(none, chosen, bound, eff)
        if len(d2) < 2:
            left.append({"op": op, "why": "fewer than two shared rounds"})
            continue
        cols.append((d1, d2))
        names.append(op)
    if not cols:
        return Efficiency(None, None, None, 0, why="no op with a figure", left_out=left)
    hidden = sum(statistics.fmean(d1) for d1, _ in cols)
    exposed = sum(statistics.fmean(d2) for _, d2 in cols)
    rounds = sum(len(d2) for _, d2 in cols)
    if exposed <= 0:
        return Efficiency(None, None, None, rounds, exposed_ms=exposed, ops=names, left_out=left,
                          why="no exposed communication measured")
    e = hidden / exposed
    vs = [statistics.variance([a - e * b for a, b in zip(d1, d2)]) / len(d2) for d1, d2 in cols]
    var = sum(vs)
    df = var ** 2 / sum(v ** 2 / (len(d2) - 1) for v, (_, d2) in zip(vs, cols)) if var > 0 else 1e9
    half = t975(df) * math.sqrt(var) / exposed
    return Efficiency(_clip(e), _clip(e - half), _clip(e + half), rounds, raw=e, exposed_ms=exposed,
                      hidden_ms=exposed * _clip(e), capped="at bound" if e > 1 else "at none" if e < 0 else None,
                      ops=names, left_out=left)
