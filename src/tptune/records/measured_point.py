"""A measured point: one member of a session as its run.json records it, typed.

Read once at the edge (records.sessions for run.json, records.load for the points point.json and
decisions.json hold) and passed inward as values. The layout::

    {"case": id, "status": "ok"|"failed", "session": "qkv/tp2/point", "error": {...} | null,
     "timing": {"total_ms": {"n", "median", "p10", "p90", "spread", "samples", "rounds", "round_ids",
                             "round_iters", ...}, "fwd_ms": {...}, "bwd_ms": {...},
                "per_rank_median_total_ms": [...]},
     "host": {"host_ms", "host_bound", "host_ahead", "batches": [...]}, "correctness": {...},
     "environment": {...}, "launch": {...}, "clock": {...}, ...}

The fields decisions read are typed; the rest is kept as recorded, with the record's key order, so that
``to_dict`` writes back exactly what ``from_dict`` read (point.json and decisions.json carry points, and a
re-derived run must be byte-identical). A failed point, or one without the timing metric, counts as
infinitely slow.
"""
from __future__ import annotations

import copy
import math
import statistics
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from tptune.errors import RecordError

METRIC = "total_ms"          # the time every decision compares: fwd + bwd of one op
INF = math.inf

_NUMBERS = ("median", "p10", "p90", "spread", "n")
_SERIES = ("samples", "rounds", "round_ids", "round_iters")
_RECORDS = ("error", "host", "correctness", "environment", "launch", "clock", "burn_in")


_COUNTS = ("n", "spread", "round_ids", "round_iters")   # the typed figures that are no times: at least 0


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _unmeasurable(k: str, v) -> str | None:
    """Why the number ``v`` of timing figure ``k`` is none a clock gives (NaN, inf, a time at or below 0, a
    count below 0), or None where it could be one: a record is checked where it is read, so that no
    decision words a time that was never measured."""
    if not math.isfinite(v):
        return f"{v}: expected a finite number"
    if k in _COUNTS:
        return f"{v}: expected a number at least 0" if v < 0 else None
    return f"{v}: expected a time in ms above 0" if v <= 0 else None


def _check_numbers(field: str, k: str, v) -> None:
    """errors.RecordError naming ``field`` where ``v`` (timing figure ``k``: a number or a list of them, as
    recorded) holds one no clock gives."""
    for x in (v if isinstance(v, list) else [v]):
        why = _number(x) and _unmeasurable(k, x)
        if why:
            raise RecordError(f"{field}: {why}")


@dataclass(frozen=True)
class TimingSummary:
    """One metric's summary (``timing.<metric>`` of run.json): the median and spread over the samples, the
    samples, and per round its value (``rounds``), id (``round_ids``) and iteration count (``round_iters``).
    ``other`` holds the figures nothing decides on (mean, min, max, q1, q3, iter_median) as recorded;
    ``layout`` the record's key order. Absent fields are None."""
    median: float | None = None
    p10: float | None = None
    p90: float | None = None
    spread: float | None = None
    n: int | None = None
    samples: tuple[float, ...] | None = None
    rounds: tuple[float, ...] | None = None
    round_ids: tuple[int, ...] | None = None
    round_iters: tuple[int, ...] | None = None
    other: Mapping[str, Any] = field(default_factory=dict)
    layout: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.layout:   # built, not read: the fields it has, in run.json's order
            object.__setattr__(self, "layout", tuple(k for k in _NUMBERS + _SERIES if getattr(self, k) is not None)
                               + tuple(self.other))

    @classmethod
    def from_dict(cls, d, where: str) -> "TimingSummary":
        if not isinstance(d, dict):
            raise RecordError(f"{where}: expected a mapping of timing figures, got {type(d).__name__}")
        typed = {}
        for k in _NUMBERS:
            if d.get(k) is not None and not _number(d[k]):
                raise RecordError(f"{where}.{k}: expected a number, got {d[k]!r:.60}")
            typed[k] = d.get(k)
        for k in _SERIES:
            v = d.get(k)
            if v is not None and not (isinstance(v, list) and all(_number(x) for x in v)):
                raise RecordError(f"{where}.{k}: expected a list of numbers, got {v!r:.60}")
            typed[k] = None if v is None else tuple(v)
        other = {k: v for k, v in d.items() if k not in _NUMBERS and k not in _SERIES}
        for k, v in d.items():   # mean, min, max, q1, q3, iter_median too: decisions.json carries them
            _check_numbers(f"{where}.{k}", k, v)
        return cls(**typed, other=other, layout=tuple(d))

    def to_dict(self) -> dict:
        out = {}
        for k in self.layout:
            if k in _NUMBERS:
                out[k] = getattr(self, k)
            elif k in _SERIES:
                v = getattr(self, k)
                out[k] = None if v is None else list(v)
            else:
                out[k] = copy.deepcopy(self.other[k])
        return out

    def with_(self, **changes) -> "TimingSummary":
        """This summary with ``changes`` (typed fields), a field it lacked added at the end."""
        return replace(self, **changes, layout=self.layout + tuple(k for k in changes if k not in self.layout))

    def without(self, *names: str) -> "TimingSummary":
        """This summary without the typed fields ``names`` (as if never recorded)."""
        return replace(self, **{k: None for k in names}, layout=tuple(k for k in self.layout if k not in names))

    def round_values(self) -> dict[int, float]:
        """{round id: value}; ids by position where none are recorded (or they do not match the values)."""
        vals, ids = self.rounds or (), self.round_ids
        ids = ids if ids and len(ids) == len(vals) else range(len(vals))
        return {int(i): float(v) for i, v in zip(ids, vals)}


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured member (module doc). ``timing``: the metrics with a summary; ``timing_other`` the
    timing entries that are not summaries (per_rank_median_total_ms). The sub-records (error, host, ...)
    are kept as recorded, read through the properties below; ``other`` holds the fields nothing here
    reads (model, settings, attempts, ...); ``layout`` and ``timing_layout`` the record's key order."""
    case: str
    status: str
    session: str | None = None
    timing: Mapping[str, TimingSummary] = field(default_factory=dict)
    timing_other: Mapping[str, Any] = field(default_factory=dict)
    error: Mapping | None = None
    host: Mapping | None = None
    correctness: Mapping | None = None
    environment: Mapping | None = None
    launch: Mapping | None = None
    clock: Mapping | None = None
    burn_in: Mapping | None = None
    other: Mapping[str, Any] = field(default_factory=dict)
    layout: tuple[str, ...] = ()
    timing_layout: tuple[str, ...] = ()

    def __post_init__(self):
        if not self.layout:   # built, not read: case, status, then the fields it has
            has = {"timing": bool(self.timing or self.timing_other),
                   **{k: getattr(self, k) is not None for k in ("session", *_RECORDS)}}
            object.__setattr__(self, "layout", ("case", "status", *(k for k, v in has.items() if v), *self.other))
        if not self.timing_layout:
            object.__setattr__(self, "timing_layout", tuple(self.timing) + tuple(self.timing_other))

    # -- reading and writing the record

    @classmethod
    def from_dict(cls, d, source: str = "a measured point") -> "MeasuredPoint":
        """The point recorded as ``d`` (run.json's layout); ``source`` names the file (and where in it) for
        the error a malformed record raises."""
        if not isinstance(d, dict):
            raise RecordError(f"{source}: expected a measured point (a mapping with case, status, timing), "
                              f"got {type(d).__name__}")
        for k in ("case", "status"):
            if not isinstance(d.get(k), str):
                raise RecordError(f"{source}: field {k!r}: expected a string, got {d.get(k)!r:.60}")
        if d.get("session") is not None and not isinstance(d["session"], str):
            raise RecordError(f"{source}: field 'session': expected a session name, got {d['session']!r:.60}")
        for k in _RECORDS:
            if d.get(k) is not None and not isinstance(d[k], dict):
                raise RecordError(f"{source}: field {k!r}: expected a mapping or null, got {d[k]!r:.60}")
        raw_timing = d.get("timing")
        if raw_timing is not None and not isinstance(raw_timing, dict):
            raise RecordError(f"{source}: field 'timing': expected a mapping of metrics, got {raw_timing!r:.60}")
        raw_timing = raw_timing or {}
        timing = {m: TimingSummary.from_dict(v, f"{source}: field 'timing.{m}'")
                  for m, v in raw_timing.items() if isinstance(v, dict)}
        for m, v in raw_timing.items():
            if m not in timing:   # per_rank_median_total_ms: per rank, a time
                _check_numbers(f"{source}: field 'timing.{m}'", m, v)
        return cls(case=d["case"], status=d["status"], session=d.get("session"), timing=timing,
                   timing_other={m: v for m, v in raw_timing.items() if m not in timing},
                   **{k: d.get(k) for k in _RECORDS},
                   other={k: v for k, v in d.items() if k not in _OWN},
                   layout=tuple(d), timing_layout=tuple(raw_timing))

    def to_dict(self) -> dict:
        """The record in run.json's layout, exactly as read (with any change made through ``with_``)."""
        out = {}
        for k in self.layout:
            if k == "timing":
                out[k] = {m: self.timing[m].to_dict() if m in self.timing else copy.deepcopy(self.timing_other[m])
                          for m in self.timing_layout}
            elif k in _OWN:
                out[k] = copy.deepcopy(getattr(self, k))
            else:
                out[k] = copy.deepcopy(self.other[k])
        return out

    def with_(self, **changes) -> "MeasuredPoint":
        """This point with ``changes`` (typed fields); a field it lacked is added at the end, as a dict's
        update would."""
        keys = self.layout + tuple(k for k in changes if k not in self.layout)
        if "timing" in changes:
            tk = self.timing_layout + tuple(m for m in changes["timing"] if m not in self.timing_layout)
            changes["timing_layout"] = tuple(m for m in tk if m in changes["timing"] or m in self.timing_other)
        return replace(self, **changes, layout=keys)

    # -- what decisions read

    def summary(self, metric: str = METRIC) -> TimingSummary | None:
        """The timing summary of ``metric``, or None when the point failed or has no median of it."""
        if self.status != "ok":
            return None
        t = self.timing.get(metric)
        return t if t is not None and t.median is not None else None

    @property
    def ok(self) -> bool:
        """Measured: ok with a median of the decisions' metric."""
        return self.summary() is not None

    def median(self, metric: str = METRIC) -> float:
        """Median time in ms; +inf for a failed point or one without the metric."""
        t = self.summary(metric)
        return INF if t is None else float(t.median)

    def samples(self, metric: str = METRIC) -> list[float]:
        t = self.summary(metric)
        return [] if t is None else [float(x) for x in t.samples or ()]

    def rounds(self, metric: str = METRIC) -> dict[int, float]:
        """{round id: value} (empty for a failed point or one without rounds)."""
        t = self.timing.get(metric) if self.status == "ok" else None
        return {} if t is None else t.round_values()

    def recorded_median(self, metric: str = METRIC) -> float | None:
        """The median recorded for ``metric``, whatever the status; None where none is."""
        t = self.timing.get(metric)
        return None if t is None else t.median

    def search_summary(self) -> dict:
        """What a search record keeps of a point: case, status, session and median (ms; None if failed)."""
        return {"case": self.case, "status": self.status, "session": self.session,
                "median_ms": self.recorded_median()}

    @property
    def error_kind(self) -> str | None:
        return (self.error or {}).get("kind")

    @property
    def error_message(self) -> str | None:
        return (self.error or {}).get("message")

    @property
    def correct(self) -> bool | None:
        """The numerics check's verdict (correctness.ok); None where none ran."""
        return (self.correctness or {}).get("ok")

    @property
    def host_ms(self) -> float | None:
        return (self.host or {}).get("host_ms")

    @property
    def host_bound(self) -> bool | None:
        return (self.host or {}).get("host_bound")

    @property
    def host_ahead(self) -> bool | None:
        return (self.host or {}).get("host_ahead")

    @property
    def host_batches(self) -> list[dict]:
        """The host-ahead evidence of each timed batch (stats.host_evidence reads it)."""
        return (self.host or {}).get("batches") or []

    @property
    def attempts(self) -> list[dict]:
        """Each attempt at the member (its worker group, timings, its error where it failed)."""
        return self.other.get("attempts") or []

    @property
    def model(self) -> dict | None:
        """The model and workload it was measured with, as run.json records them."""
        return self.other.get("model")

    @property
    def settings(self) -> dict | None:
        """The measurement settings it was measured with, as run.json records them."""
        return self.other.get("settings")

    @property
    def traces(self) -> list[str]:
        """The member's profiler traces, relative to its run.json (none where timing.profile_steps is 0)."""
        return self.other.get("traces") or []

    @property
    def workload(self) -> dict:
        """The workload it was measured with (seq_length, micro_batch_size, dtype, recipe)."""
        return (self.model or {}).get("workload") or {}

    @property
    def wall_s(self) -> float | None:
        """The member's wall time over its rounds (s)."""
        return self.other.get("wall_s")

    @property
    def shapes(self) -> list[dict]:
        """Per shape of an op measured at several (worker.harness.run_case): its median there."""
        return self.other.get("shapes") or []

    @property
    def gpu_memory_gib(self) -> float | None:
        return (self.environment or {}).get("gpu_memory_gib")

    # -- derived points

    def slim(self) -> "MeasuredPoint":
        """What decisions keep of a run.json (point.json, decisions.json): case, status, session, the timing
        summaries without their samples, the host figures without their batches, clock and error."""
        timing = {m: t.without("samples") for m, t in self.timing.items()}
        return MeasuredPoint(self.case, self.status, self.session, timing=timing, timing_other=self.timing_other,
                             host={k: v for k, v in (self.host or {}).items() if k != "batches"},
                             clock=self.clock, error=self.error,
                             layout=("case", "status", "session", "timing", "host", "clock", "error"),
                             timing_layout=self.timing_layout)


_OWN = {f.name for f in fields(MeasuredPoint)} - {"other", "layout", "timing_layout", "timing_other"}


def json_default(obj):
    """json.dumps' ``default`` for records that carry measured points (point.json, decisions.json)."""
    if isinstance(obj, MeasuredPoint):
        return obj.to_dict()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def make_point(case: str, samples: list[float] | None = None, status: str = "ok",
               metric: str = METRIC) -> MeasuredPoint:
    """A point built from raw samples (synthetic runs, sums, tests), in run.json's layout."""
    if status != "ok" or not samples:
        return MeasuredPoint.from_dict({"case": case, "status": "failed" if status == "ok" else status,
                                        "timing": {}})
    xs = sorted(float(x) for x in samples)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    med = statistics.median(xs)
    return MeasuredPoint.from_dict({"case": case, "status": "ok", "timing": {metric: {
        "median": med, "p10": q[0], "p90": q[8], "spread": (q[8] - q[0]) / med if med else 0.0,
        "n": len(xs), "samples": list(samples)}}})


def decided_points(decisions: dict, op: str, tp) -> dict[str, MeasuredPoint | None]:
    """The measured points decisions.json keeps of op ``op`` at TP ``tp`` (``ops.<op>.points.<tp>``: none,
    nocomm, best, fastest), typed; {} where it keeps none."""
    rec = ((decisions["ops"].get(op) or {}).get("points") or {}).get(str(tp)) or {}
    return {k: None if rec.get(k) is None else MeasuredPoint.from_dict(rec[k], f"decisions.json ops.{op}.points.{tp}.{k}")
            for k in ("none", "nocomm", "best", "fastest") if k in rec}
