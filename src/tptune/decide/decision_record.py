"""One op's entry of decisions.json: the chosen TP and config, the winning and runner-up points and
every case id the evidence cites."""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import INF, point_case, point_median
from tptune.stats.noise import DEFAULT_FLOOR, DEFAULT_K, compare_points, margin


def decisions_record(op: str, *, tp: int, config: dict | None, winner: MeasuredPoint | None,
                     runner_up: MeasuredPoint | None = None, tp_evidence: Iterable[dict] = (),
                     comparisons: Iterable[dict] = (), searches: Mapping[str, list] | None = None,
                     floor: float = DEFAULT_FLOOR, k: float = DEFAULT_K) -> dict:
    """One op's entry of decisions.json: chosen TP and config, the winning and runner-up points, the
    noise margin between them and how much faster the winner was, the evidence records (TP rule,
    comparisons, bisection paths) and every case id they cite."""
    comparisons, tp_evidence = list(comparisons), list(tp_evidence)
    searches = dict(searches or {})
    rec = {
        "op": op, "tp": tp, "config": config,
        "winner": _summary(winner), "runner_up": _summary(runner_up),
        "margin": margin(winner, runner_up, floor, k) if runner_up is not None else None,
        "win_by": _win_by(winner, runner_up),
        "vs_runner_up": (compare_points(winner, runner_up, floor=floor, k=k, tie="a").to_dict()
                         if winner is not None and runner_up is not None else None),
        "tp_evidence": tp_evidence, "comparisons": comparisons, "searches": searches,
    }
    rec["evidence_cases"] = sorted(_case_ids([winner, runner_up, tp_evidence, comparisons, searches]))
    return rec


def _summary(point: MeasuredPoint | None) -> dict | None:
    if point is None:
        return None
    t = point_median(point)
    return {"case": point_case(point), "median_ms": None if t == INF else t}


def _win_by(winner: MeasuredPoint | None, runner_up: MeasuredPoint | None) -> float | None:
    """(runner-up - winner) / runner-up: the winner's relative gain."""
    a, b = point_median(winner), point_median(runner_up)
    if winner is None or runner_up is None or INF in (a, b) or b == 0:
        return None
    return (b - a) / b


def _case_ids(obj) -> set[str]:
    """Every string under a "case" key, or in a "cases" list, anywhere in ``obj``."""
    found: set[str] = set()
    if isinstance(obj, MeasuredPoint):
        return _case_ids(obj.to_dict())
    if isinstance(obj, Mapping):
        for key, v in obj.items():
            if key == "case" and isinstance(v, str):
                found.add(v)
            elif key == "cases" and isinstance(v, list):
                found.update(x for x in v if isinstance(x, str))
            else:
                found |= _case_ids(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            found |= _case_ids(v)
    return found
