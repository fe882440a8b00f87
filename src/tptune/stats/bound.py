"""The no-communication bound: its burn-in round and the bound-fault test.

Burn-in. In the point sessions recorded then (40 with a bound; docs/figures.md) the bound's value in
round 0, relative to no overlap, reads +4.1% (median +3.1%) above the same ratio in its later rounds,
while every setting measured in round 0 reads as in its later rounds (-0.6% at position 2, +0.3% later);
from round 1 on the bound sits where it does in the rest of the session, also in round 1 where it is
measured first. So the artefact is the bound's first round (its first build in the session, measured right
after no overlap's), not its position: the bound's first round is a burn-in, kept in run.json and left out
of every figure the bound enters (faults, efficiency, the TP rule's sums).

Fault. A bound slower than a setting it bounds beyond the noise, by the same paired statistic the
efficiency uses (per-round log ratio bound/setting, 95% interval entirely above 1), is a measurement
fault: the report shows the fault instead of a percentage. That is the one definition (``fault``): the
faults listed, the efficiency's and the TP rule's words all ask it. An estimate above 1 whose interval
holds 1 is no fault (issue 54: 1.024 [0.763, 1.373] was listed as one): the noise cannot tell the bound
from the setting, and the efficiency words it as at the bound or undecided. Points recorded without
rounds have no interval: their medians are held against the margin.
"""
from __future__ import annotations

import statistics

from tptune.records.measured_point import METRIC, MeasuredPoint
from tptune.stats.rounds import Ratio, paired_ratio, point_rounds

BOUND_BURN_IN_ROUNDS = 1
FAULT_MARGIN = 0.02          # decision.noise_floor's default


def is_bound(case_id: str | None) -> bool:
    return bool(case_id) and case_id.endswith("-nocomm")


def burned_in(point: MeasuredPoint | None, rounds: int = BOUND_BURN_IN_ROUNDS) -> MeasuredPoint | None:
    """The bound's point without its first ``rounds`` measured rounds (the median over the rest); the
    point as it is when that would leave fewer than two rounds. ``burn_in`` records what was left out."""
    r = point_rounds(point)
    if not r or len(r) - rounds < 2:
        return point
    ids = sorted(r)
    keep, dropped = ids[rounds:], ids[:rounds]
    kept = [r[i] for i in keep]
    timing = dict(point.timing)
    timing[METRIC] = timing[METRIC].with_(rounds=tuple(kept), round_ids=tuple(keep),
                                          median=statistics.median(kept)).without("round_iters", "samples")
    for k in ("fwd_ms", "bwd_ms"):   # their rounds stay whole: only total_ms enters a figure
        if k in timing:
            timing[k] = timing[k].without("samples")
    return point.with_(timing=timing,
                       burn_in={"dropped_rounds": dropped, "why": "the bound's first round reads high (stats.bound)"})


def bound_vs(bound: MeasuredPoint, setting: MeasuredPoint) -> Ratio | None:
    """bound / setting over the rounds of one session both were measured in; None without two."""
    if bound.session is None or bound.session != setting.session:
        return None
    r = paired_ratio(point_rounds(bound), point_rounds(setting))
    return r if r is not None and r.rounds >= 2 else None


def is_fault(r: Ratio | None) -> bool:
    """The bound reads slower than the setting beyond the noise: the 95% interval of their paired
    bound / setting lies entirely above 1 (module doc)."""
    return r is not None and r.lo is not None and r.lo > 1.0


def fault(bound: MeasuredPoint | None, setting: MeasuredPoint | None, margin: float = FAULT_MARGIN) -> dict | None:
    """The bound fault of ``bound`` (after its burn-in) against a ``setting`` it bounds, or None: from the
    rounds both were measured in (is_fault); for points recorded without rounds, their medians against the
    margin. Two points with rounds that share fewer than two, or were measured in different sessions, are
    not judged. Every statement of a bound fault asks this."""
    if bound is None or setting is None or bound.median() == float("inf") or setting.median() == float("inf"):
        return None
    note = "bound slower than a setting it bounds: measurement fault"
    if point_rounds(bound) and point_rounds(setting):
        r = bound_vs(bound, setting)
        return {"bound": bound.case, "above": setting.case, **r.to_dict(), "note": note} if is_fault(r) else None
    if bound.median() > setting.median() * (1 + margin):
        return {"bound": bound.case, "above": setting.case, "ratio": bound.median() / setting.median(),
                "note": note + " (medians)"}
    return None


def bound_faults(points: dict[str, MeasuredPoint], margin: float = FAULT_MARGIN) -> list[dict]:
    """Every setting measured beside the bound that the bound reads slower than (``fault``)."""
    bound = next((p for c, p in points.items() if is_bound(c)), None)
    faults = [fault(bound, p, margin) for p in points.values() if p is not bound]
    return [f for f in faults if f]


def bound_above_rounds(bound: MeasuredPoint, setting: MeasuredPoint) -> tuple[int, int]:
    """(rounds where the bound reads slower than the setting, rounds both were measured in)."""
    a, b = point_rounds(bound), point_rounds(setting)
    common = sorted(set(a) & set(b))
    return sum(a[r] > b[r] for r in common), len(common)


def burn_in_replay(sessions) -> dict:
    """What leaving the bound's first round out changes over point sessions ``sessions`` ((name, {case id:
    point}) pairs; those without a bound measured in rounds are skipped): per side ('before' with the first
    round, 'after' without it) the setting-rounds where the bound reads slower than a setting it bounds
    (``above``, of ``rounds``) and the bound faults (is_fault against every other setting, ``faults``, with
    the sessions they are in, ``where``)."""
    out = {"sessions": 0, **{k: {"above": 0, "rounds": 0, "faults": 0, "where": []} for k in ("before", "after")}}
    for name, points in sessions:
        b = next((p for c, p in points.items() if is_bound(c) and point_rounds(p)), None)
        if b is None:
            continue
        out["sessions"] += 1
        sides = {"before": b, "after": burned_in(b)}
        for cid, p in points.items():
            if p is b or not point_rounds(p):
                continue
            for side, bb in sides.items():
                k, n = bound_above_rounds(bb, p)
                out[side]["above"] += k
                out[side]["rounds"] += n
                if is_fault(bound_vs(bb, p)):
                    out[side]["faults"] += 1
                    out[side]["where"].append(f"{name}: {cid}")
    return out
