"""The pick among points measured side by side: the cheapest setting no other beats beyond the noise."""
from __future__ import annotations

from tptune.records.measured_point import MeasuredPoint
from tptune.stats.noise import compare_points, cost_key


def pick_best(points: list[MeasuredPoint], floor: float) -> tuple[MeasuredPoint | None, list[dict]]:
    """The pick among measured points: the leader is the fastest (by median); every other point is
    compared with it, and the pick is the cheapest point that the leader does not beat beyond the
    noise and that no other point beats either (the leader itself when it beats all). A point beaten
    by any setting is out even where its comparison with the leader is undecided: a session drops a
    member once some setting beats it, so it may share too few rounds with the leader to lose to it
    (on x2, no overlap lost to one qkv setting by 1.059 [1.043, 1.076] and was undecided against the
    leader by median, 0.953 [0.909, 0.998] over its 3 rounds). The pick does not depend on the order
    of the comparisons (ties are not transitive)."""
    ok = [p for p in points if p.median() != float("inf")]
    if not ok:
        ordered = sorted(points, key=lambda p: cost_key(p.case))
        return (ordered[0] if ordered else None), []
    leader = min(ok, key=lambda p: (p.median(), cost_key(p.case)))
    tied, comparisons = [leader], []
    for p in sorted(points, key=lambda p: cost_key(p.case)):
        if p is leader:
            continue
        cmp = compare_points(leader, p, floor=floor, tie="a")
        comparisons.append(cmp.to_dict())
        if cmp.outcome == 0 and not _beaten(p, ok, floor, comparisons):
            tied.append(p)
    return min(tied, key=lambda p: cost_key(p.case)), comparisons


def _beaten(p: MeasuredPoint, others: list[MeasuredPoint], floor: float, comparisons: list) -> bool:
    """Whether some other point beats ``p`` beyond the noise (that comparison is recorded)."""
    for q in others:
        if q is p or q.case == p.case:
            continue
        cmp = compare_points(q, p, floor=floor, tie="a")
        if cmp.outcome < 0:   # q faster beyond the noise
            comparisons.append(cmp.to_dict())
            return True
    return False
