"""Accessors for measured points, so the run.json field path lives in one place.

A point is the dict read from a case's run.json:
``{"case": id, "status": "ok"|"failed", "timing": {"total_ms": {"median", "p10", "p90", "spread", "n",
"samples"}, "fwd_ms": {...}, "bwd_ms": {...}}}``.
A failed point, or one without the timing metric, counts as infinitely slow.
"""
from __future__ import annotations

import math
import statistics

METRIC = "total_ms"          # the time every decision compares: fwd + bwd of one op
INF = math.inf


def point_case(point: dict | None) -> str | None:
    return None if point is None else point.get("case")


def point_stats(point: dict | None, metric: str = METRIC) -> dict | None:
    """The timing summary of ``metric``, or None when the point failed or lacks it."""
    if not point or point.get("status") != "ok":
        return None
    stats = (point.get("timing") or {}).get(metric)
    if not stats or stats.get("median") is None:
        return None
    return stats


def point_ok(point: dict | None, metric: str = METRIC) -> bool:
    return point_stats(point, metric) is not None


def point_median(point: dict | None, metric: str = METRIC) -> float:
    """Median time in ms; +inf for a failed or missing point."""
    stats = point_stats(point, metric)
    return INF if stats is None else float(stats["median"])


def point_summary(point: dict) -> dict:
    """What a search record keeps of a point: case, status, session and median (ms; None if failed)."""
    return {"case": point["case"], "status": point["status"], "session": point.get("session"),
            "median_ms": (point.get("timing") or {}).get("total_ms", {}).get("median")}


def point_samples(point: dict | None, metric: str = METRIC) -> list[float]:
    stats = point_stats(point, metric)
    return [] if stats is None else [float(x) for x in stats.get("samples") or []]


def make_point(case: str, samples: list[float] | None = None, status: str = "ok",
               metric: str = METRIC) -> dict:
    """A point in run.json's layout built from raw samples (tests, synthetic runs)."""
    if status != "ok" or not samples:
        return {"case": case, "status": "failed" if status == "ok" else status, "timing": {}}
    xs = sorted(float(x) for x in samples)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    med = statistics.median(xs)
    return {"case": case, "status": "ok", "timing": {metric: {
        "median": med, "p10": q[0], "p90": q[8], "spread": (q[8] - q[0]) / med if med else 0.0,
        "n": len(xs), "samples": list(samples)}}}
