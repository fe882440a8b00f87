"""Binary search for the fastest value of an ordered candidate list, one checkpoint step at a time.

Candidates are ordered cheapest first (SM counts [1, 2, 4, ...], chunk counts [2, 4, 8]) and the
time curve over them is assumed unimodal. Each step looks at the middle of the interval [lo, hi]:
it compares the points at mid and mid+1 (noise.compare_points); if mid+1 is faster by more than the
margin the minimum lies in [mid+1, hi], otherwise (mid faster, or a tie: toward the cheaper value)
in [lo, mid]. The search ends when the interval holds one candidate. That takes ceil(log2(len))
steps of at most two new points each. A failed point is infinitely slow.

The state is nothing but the measured points: every call replays the steps from the start, so the
search resumes from any subset of measured points (extra points are ignored).

Side by side (``pairs``): each step's two points are measured together in one session, in
alternating rounds, and compared only with each other. ``pairs`` maps (left, right) to the two
points of the session that compared them; a step whose pair has no session asks for both values,
even when one was measured in an earlier step. A single candidate needs no measurement then.
"""
from __future__ import annotations

from collections.abc import Hashable, Sequence

from tptune.stats.noise import DEFAULT_FLOOR, DEFAULT_K, compare_points


def next_points(candidates: Sequence[Hashable], measured: dict, *, floor: float = DEFAULT_FLOOR,
                k: float = DEFAULT_K, pairs: dict | None = None, win: float | None = None) -> list:
    """Values to measure next (at most two, in candidate order); empty when the search is done.
    ``win``: the margin a step's paired comparison wins beyond (noise.compare_points)."""
    todo, _, _ = _replay(candidates, measured, floor, k, pairs, win)
    return todo


def result(candidates: Sequence[Hashable], measured: dict, *, floor: float = DEFAULT_FLOOR,
           k: float = DEFAULT_K, pairs: dict | None = None, win: float | None = None) -> tuple:
    """(best value, path). ``path`` has one record per step: the interval searched, the two values
    compared (their points were first needed in that step), the comparison and the half kept.
    Raises ValueError while points are still missing."""
    todo, best, path = _replay(candidates, measured, floor, k, pairs, win)
    if todo:
        raise ValueError(f"search not finished: measure {todo} next")
    return best, path


def _replay(candidates, measured, floor, k, pairs=None, win=None):
    cands = list(candidates)
    if not cands:
        raise ValueError("no candidates to search")
    if len(set(cands)) != len(cands):
        raise ValueError(f"candidates must be distinct: {cands}")
    lo, hi, path = 0, len(cands) - 1, []
    if lo == hi:
        return ([] if pairs is not None or cands[0] in measured else [cands[0]]), cands[0], path
    while lo < hi:
        mid = (lo + hi) // 2
        left, right = cands[mid], cands[mid + 1]
        if pairs is not None:
            if (left, right) not in pairs:
                return [left, right], None, path
            p_left, p_right = pairs[(left, right)]
        else:
            missing = [v for v in (left, right) if v not in measured]
            if missing:
                return missing, None, path
            p_left, p_right = measured[left], measured[right]
        cmp = compare_points(p_left, p_right, floor=floor, k=k, tie="a", win=win)
        interval = [cands[lo], cands[hi]]
        if cmp.winner == "b":
            lo = mid + 1
        else:
            hi = mid
        path.append({"step": len(path) + 1, "interval": interval, "compared": [left, right],
                     "comparison": cmp.to_dict(), "kept": [cands[lo], cands[hi]]})
    return [], cands[lo], path
