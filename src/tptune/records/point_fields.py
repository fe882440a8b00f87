"""Readers of an optional measured point (records.measured_point.MeasuredPoint or None, where a setting
was not measured): a missing point has no case and counts as infinitely slow."""
from __future__ import annotations

from tptune.records.measured_point import INF, METRIC, MeasuredPoint, make_point

__all__ = ["INF", "METRIC", "make_point", "point_case", "point_median", "point_ok"]


def point_case(point: MeasuredPoint | None) -> str | None:
    return None if point is None else point.case


def point_ok(point: MeasuredPoint | None, metric: str = METRIC) -> bool:
    return point is not None and point.summary(metric) is not None


def point_median(point: MeasuredPoint | None, metric: str = METRIC) -> float:
    """Median time in ms; +inf for a failed or missing point."""
    return INF if point is None else point.median(metric)
