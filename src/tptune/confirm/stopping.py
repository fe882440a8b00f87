"""When the confirm stage has measured enough: rounds are added one at a time until every headline ratio (the set
against the best preset, and against each reference preset run as its own arm) has a 95% half-width of at most
the target (0.5% by default), or the next round would pass the time budget, or the rounds reach their cap. A stage
that stops unresolved says so, with the rounds the present spread would need (the half-width scales as
t(n-1)/sqrt(n) at the same per-round spread).

An added round runs only the arms its unresolved pairs need (the set and those references, in SETTINGS order,
rotated as every round): no overlap, and a reference already resolved, have their rounds from the first ones, and
a launch costs as much as any other, so leaving them out fits more of the rounds that decide into the budget.
"""
from __future__ import annotations

import math

from tptune.stats.rounds import t975

REFERENCE_ARMS = ("preset", "nemo")


def headline_pairs(arms: list[str]) -> list[tuple[str, str]]:
    return [("set", a) for a in REFERENCE_ARMS if a in arms]


def half_width(r: dict | None) -> float | None:
    """The interval's half-width, relative: (hi - lo) / 2 (the ratios are near 1); None without an interval."""
    if not r or r.get("lo") is None or r.get("hi") is None or not math.isfinite(r["hi"]) or r["rounds"] < 2:
        return None
    return (r["hi"] - r["lo"]) / 2


def resolved(ratios: dict, pairs: list[tuple[str, str]], target: float) -> bool:
    hws = [half_width(ratios.get(f"{a}/{b}")) for a, b in pairs]
    return bool(pairs) and all(h is not None and h <= target for h in hws)


def rounds_needed(r: dict | None, target: float, cap: int = 200) -> int | None:
    """The rounds at which ``r``'s half-width would reach ``target`` at its present per-round spread (None: no
    interval yet, or beyond ``cap``)."""
    hw = half_width(r)
    if hw is None:
        return None
    n0 = r["rounds"]
    if hw <= target:
        return n0
    scale = hw / (t975(n0 - 1) / math.sqrt(n0))
    for n in range(n0 + 1, cap + 1):
        if scale * t975(n - 1) / math.sqrt(n) <= target:
            return n
    return None


def verdict(ratios: dict, pairs: list[tuple[str, str]], target: float) -> dict:
    """Per headline pair: its half-width, whether it is resolved, and the rounds it would need."""
    out = {}
    for a, b in pairs:
        r = ratios.get(f"{a}/{b}")
        hw = half_width(r)
        out[f"{a}/{b}"] = {"half_width": None if hw is None else round(hw, 5),
                           "resolved": hw is not None and hw <= target, "rounds_needed": rounds_needed(r, target)}
    return {"target_half_width": target, "pairs": out, "resolved": resolved(ratios, pairs, target)}


def arms_needed(arms: list[str], ratios: dict, pairs: list[tuple[str, str]], target: float) -> list[str]:
    """The arms an added round runs (module doc): the set and each reference whose pair is unresolved."""
    open_refs = {b for a, b in pairs if (h := half_width(ratios.get(f"{a}/{b}"))) is None or h > target}
    return [a for a in arms if a == "set" or a in open_refs]
