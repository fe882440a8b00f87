"""Medians and spreads of timing samples (no torch: the launcher and reports use it)."""
from __future__ import annotations

import statistics


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(samples: list[float]) -> dict:
    """Median and spread of one series; ``spread`` is the interquartile range relative to the median."""
    if not samples:
        return {"n": 0}
    med = statistics.median(samples)
    q1, q3 = _quantile(samples, 0.25), _quantile(samples, 0.75)
    return {
        "n": len(samples), "median": med, "mean": statistics.fmean(samples),
        "min": min(samples), "max": max(samples),
        "p10": _quantile(samples, 0.10), "p90": _quantile(samples, 0.90),
        "q1": q1, "q3": q3, "spread": (q3 - q1) / med if med else 0.0,
        "samples": [round(x, 6) for x in samples],
    }


def slowest_rank(per_rank: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Iteration i of a TP op takes as long as its slowest rank: element-wise max over ranks."""
    keys = per_rank[0].keys()
    return {k: [max(vals) for vals in zip(*(r[k] for r in per_rank))] for k in keys}
