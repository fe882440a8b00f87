"""Noise-aware comparison of two measured points, with ties going to the cheaper setting.

Margin (relative to the medians):
    sigma(p)   = IQR(samples) / 1.349            robust standard deviation (needs >= 4 samples;
               else (p90 - p10) / 2.563 from the summary; else 0)
    se_rel(p)  = 1.2533 * sigma(p) / sqrt(n) / median(p)
                                                 standard error of a median of n samples, relative
    margin(a, b) = max(floor, k * sqrt(se_rel(a)^2 + se_rel(b)^2))
The floor (default 2%) stands for what the samples of one run cannot show: drift from process to
process (the device README saw 0.5-2.5% on sums of ops, up to 7.5% on one op). k = 2 is about a
95% two-sided test on the difference of two medians.

compare(a, b, margin) = -1 if a is faster: median(a) < median(b) * (1 - margin)
                        +1 if b is faster: median(b) < median(a) * (1 - margin)
                         0 otherwise (a tie: the caller picks the cheaper setting)
Failed points are infinitely slow: they lose to any point that ran, and tie with each other.

Points measured in rounds (run.json timing.total_ms.rounds, every GPU/CPU session since the
side-by-side harness) are compared by their ratio interval instead (search.rounds): a wins when the
interval of a/b lies entirely below 1 - floor, b when entirely above 1 + floor, and anything else
is a tie (resolved when the interval lies within the margin, undecided otherwise); a search step
wins at its own, smaller margin (``win``). The sample
rule above remains for points without rounds (hand-built points, sums).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tptune.cases import Case, parse_case_id
from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import INF, point_case, point_median
from tptune.stats.rounds import Ratio, ratio_of
from tptune.te.ubcfg import METHOD_DEFAULTS, case_ub_cfgs, op_entries

DEFAULT_FLOOR = 0.02
DEFAULT_K = 2.0
_METHOD_RANK = {"ring_exchange": 0, "pipeline": 1, "bulk": 2}
_KIND_RANK = {"none": 0, "nocomm": 0, "chunked": 1, "ub": 2}


def relative_se(point: MeasuredPoint | None) -> float:
    """Standard error of the point's median, as a fraction of the median (0 if unknown)."""
    t = None if point is None else point.summary()
    if t is None:
        return 0.0
    med = float(t.median)
    xs = point.samples()
    n = len(xs) or int(t.n or 0)
    if len(xs) >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        sigma = (q3 - q1) / 1.349
    elif t.p10 is not None and t.p90 is not None:
        sigma = (float(t.p90) - float(t.p10)) / 2.563
    else:
        sigma = 0.0
    if n < 1 or med <= 0:
        return 0.0
    return 1.2533 * sigma / math.sqrt(n) / med


def margin(a: MeasuredPoint | None, b: MeasuredPoint | None, floor: float = DEFAULT_FLOOR, k: float = DEFAULT_K) -> float:
    """Relative difference of medians below which ``a`` and ``b`` count as equal (module doc)."""
    m = max(floor, k * math.hypot(relative_se(a), relative_se(b)))
    return min(m, 0.99)


def compare(a: MeasuredPoint | None, b: MeasuredPoint | None, margin: float) -> int:
    """-1 if a beats b by more than ``margin`` (relative), +1 if b beats a, 0 for a tie."""
    ta, tb = point_median(a), point_median(b)
    if ta < tb * (1 - margin):
        return -1
    if tb < ta * (1 - margin):
        return 1
    return 0


def cost_key(case: Case | str) -> tuple:
    """Sort key of a setting's cost, cheapest first: smaller TP (fewer GPUs); no overlap before
    chunked before userbuffers; fewer chunks; fewer SMs taken for communication over the op's GEMMs
    in the setting's *effective* ub_cfgs (a preset's own entries count like overrides); ring_exchange
    before pipeline before bulk; fewer overrides; then the case id, so the order is total."""
    c = parse_case_id(case) if isinstance(case, str) else case
    v = c.variant
    sms = methods = 0
    if v.kind == "ub":
        try:
            # "fp8" admits every knob TE may honour: the cost only counts SMs
            cfg = op_entries(case_ub_cfgs(c, workload="fp8"), c.op)
            sms = sum(int(e.get("num_sm", METHOD_DEFAULTS[e["method"]]["num_sm"])) for e in cfg.values())
            methods = sum(_METHOD_RANK[e["method"]] for e in cfg.values())
        except (ValueError, KeyError, OSError):  # an unknown preset: fall back to the overrides
            sms = sum(dict(o.knobs).get("num_sm", METHOD_DEFAULTS[o.method]["num_sm"]) for o in v.overrides)
            methods = sum(_METHOD_RANK[o.method] for o in v.overrides)
    return (c.tp, _KIND_RANK[v.kind], v.chunks, sms, methods, len(v.overrides), c.id)


def cheaper(a_case: Case | str, b_case: Case | str) -> Case | str:
    """The cheaper of two settings by cost_key (returned as given: Case or id)."""
    return a_case if cost_key(a_case) <= cost_key(b_case) else b_case


@dataclass(frozen=True)
class Comparison:
    """One decision between two points, as written to decisions.json."""
    case_a: str | None
    case_b: str | None
    median_a: float
    median_b: float
    margin: float
    outcome: int          # -1 a faster, +1 b faster, 0 tie
    winner: str           # "a" | "b"
    reason: str           # "faster" | "tie: cheaper" | "tie: preferred"
    ratio: Ratio | None = None    # a/b with its interval and rounds (points measured in rounds)
    resolved: bool = True         # False: the interval straddles the margin (undecided -> tie)
    tie_margin: float | None = None   # a resolved tie's margin where it differs from ``margin`` (search steps)

    @property
    def winner_case(self) -> str | None:
        return self.case_a if self.winner == "a" else self.case_b

    def to_dict(self) -> dict:
        return {"a": {"case": self.case_a, "median_ms": _finite(self.median_a)},
                "b": {"case": self.case_b, "median_ms": _finite(self.median_b)},
                "margin": self.margin, "outcome": self.outcome,
                "winner": self.winner_case, "winner_side": self.winner, "reason": self.reason,
                **({"ratio": self.ratio.to_dict()} if self.ratio else {}), "resolved": self.resolved,
                **({"tie_margin": self.tie_margin} if self.tie_margin is not None else {})}


def compare_points(a: MeasuredPoint | None, b: MeasuredPoint | None, *, floor: float = DEFAULT_FLOOR, k: float = DEFAULT_K,
                   tie: str = "cheaper", win: float | None = None) -> Comparison:
    """Compare two points; on a tie the winner is the cheaper case (``tie="cheaper"``, needs case
    ids) or the side named by ``tie`` ("a" or "b", for callers that know the order of cost).
    ``win``: for points paired by rounds of one session, the margin a side wins beyond (a search
    step's decision.step_margin); a resolved tie still lies within ``floor``. Unpaired points, whose
    intervals do not carry the drift between sessions, always use ``floor``."""
    ratio = ratio_of(a, b) if point_ok_both(a, b) else None
    resolved, tie_m = True, None
    if ratio is not None and ratio.rounds >= 2:
        m = floor
        if win is not None and ratio.paired and win != floor:
            m, tie_m = win, floor
        out, resolved = ratio.outcome(m, tie_m)
    else:
        ratio = None
        m = margin(a, b, floor, k)
        out = compare(a, b, m)
    if out:
        winner, reason = ("a" if out < 0 else "b"), "faster"
    elif tie == "cheaper":
        ca, cb = point_case(a), point_case(b)
        if ca is None or cb is None:
            raise ValueError("tie='cheaper' needs both points to carry a case id")
        winner, reason = ("a" if cheaper(ca, cb) == ca else "b"), "tie: cheaper"
    elif tie in ("a", "b"):
        winner, reason = tie, "tie: preferred"
    else:
        raise ValueError(f"tie must be 'cheaper', 'a' or 'b', got {tie!r}")
    if not out and not resolved:
        reason = reason.replace("tie:", "undecided (tie):")
    if point_median(a) == INF and point_median(b) == INF:
        reason, resolved = "both failed: not compared", False   # never a tie
    return Comparison(point_case(a), point_case(b), point_median(a), point_median(b), m, out, winner, reason,
                      ratio, resolved, tie_m)


def point_ok_both(a: MeasuredPoint | None, b: MeasuredPoint | None) -> bool:
    return point_median(a) != INF and point_median(b) != INF


def _finite(x: float) -> float | None:
    """JSON has no infinity: a failed point's time is written as null."""
    return None if x == INF else x
