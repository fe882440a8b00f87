"""What a ratio's interval says against the margin, in words every figure uses.

A ratio a/b with 95% interval [lo, hi] and margin m reads:
  hi < 1 - m                 a faster beyond the margin
  hi < 1 <= ...               a faster within the margin, significant (the interval excludes 1)
  1 - m <= lo, hi <= 1 + m, lo <= 1 <= hi   a tie (equivalent within the margin, not distinguishable)
  lo > 1 + m / lo > 1        the same, slower
  otherwise                   undecided (the interval reaches past the margin on a side and covers 1)
"A tie" is only said of an interval that covers 1: 1.009 [1.002, 1.017] is "slower within the margin,
significant", never a tie.

A ratio whose interval reaches below half its estimate or above twice it (two rounds of a noisy CPU run:
0.418 [0.000, 8514.187]) is no figure: the noise cannot support its digits, and the report prints
"undecided" with the reason instead (not_a_figure).
"""
from __future__ import annotations

FASTER_BEYOND, FASTER_WITHIN = "faster beyond the margin", "faster within the margin (significant)"
SLOWER_BEYOND, SLOWER_WITHIN = "slower beyond the margin", "slower within the margin (significant)"
TIE, UNDECIDED = "tie (within the margin)", "undecided"


def classify(lo: float | None, hi: float | None, margin: float) -> str:
    """The words for an interval [lo, hi] of a ratio a/b (a faster when below 1)."""
    if lo is None or hi is None:
        return UNDECIDED
    if hi < 1 - margin:
        return FASTER_BEYOND
    if lo > 1 + margin:
        return SLOWER_BEYOND
    if hi < 1:
        return FASTER_WITHIN
    if lo > 1:
        return SLOWER_WITHIN
    if lo >= 1 - margin and hi <= 1 + margin:
        return TIE
    return UNDECIDED


def classify_ratio(r: dict | None, margin: float) -> str:
    """classify() of a ratio record ({"ratio", "lo", "hi", ...}, as Ratio.to_dict writes it)."""
    r = r or {}
    return classify(r.get("lo"), r.get("hi"), margin)


def speedup(r: dict) -> str:
    """"1.023x [1.020, 1.026]" for a ratio a/b below 1 (b/a with the interval inverted)."""
    return f"{1 / r['ratio']:.3f}x [{1 / r['hi']:.3f}, {1 / r['lo']:.3f}]"


def not_a_figure(r: dict | None) -> str | None:
    """Why a ratio record ({"ratio", "lo", "hi", "rounds"}) cannot be printed as a figure, or None where it
    can: its 95% interval reaches below half the estimate or above twice it (module doc)."""
    r = r or {}
    x, lo, hi = r.get("ratio"), r.get("lo"), r.get("hi")
    if x is None or lo is None or hi is None or x <= 0:
        return None
    if lo < x / 2 or hi > 2 * x:
        return (f"undecided ({r.get('rounds')} rounds: too noisy for a figure, the 95% interval reaching below "
                "half or above twice the estimate)")
    return None
