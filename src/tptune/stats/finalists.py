"""A significant gain is not thrown away for a tie-break.

pick_best gives a tie within the margin to the cheaper setting. A setting faster than that pick beyond
the noise (the interval of setting / pick entirely below 1) but within the margin is a *finalist*: it goes
on with the pick to the layer stage, where the block decides (layer.layer_record: the combination of the
ops' finalists wins on the block when it is faster than the tuned combination beyond the noise). Why not
simply pick it per op: a gain within the margin on one op is often not there on the block (on x2, qkv's
2.7-4.6% per op did not add up on the block, rs-dgrad-x2); the block measures what training runs.
"""
from __future__ import annotations

from tptune.records.measured_point import MeasuredPoint
from tptune.stats.rounds import Ratio, ratio_of


def finalists(pick: MeasuredPoint | None, points: list[MeasuredPoint]) -> list[dict]:
    """The points faster than ``pick`` beyond the noise (paired interval of point / pick below 1), fastest
    first, each with its ratio."""
    if pick is None or pick.median() == float("inf"):
        return []
    out = []
    for p in points:
        if p is pick or p.case == pick.case or p.median() == float("inf"):
            continue
        r: Ratio | None = ratio_of(p, pick)
        if r is not None and r.paired and r.rounds >= 2 and r.hi < 1.0:
            out.append({"case": p.case, **r.to_dict()})
    return sorted(out, key=lambda f: f["ratio"])
