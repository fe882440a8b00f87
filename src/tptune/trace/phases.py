"""Attribute kernels (or, in CPU-only traces, CPU ops) to profiler steps and
forward/backward phases.

A GPU event is tied to its CPU launch (cuda_runtime/cuda_driver event) through
``correlation``; never through gpu_user_annotation, whose GPU-side spans are
only a guess by the profiler. The launch's phase is that of the outermost
phase-marker range enclosing it on its own thread (outermost so that forward
recomputation inside a backward node counts as backward); launches outside any
marker on their thread fall back to the markers' time windows on the main
thread. The step is the ProfilerStep#N (main thread) whose time window holds
the launch, since the autograd thread has no ProfilerStep range of its own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

from tptune.trace.classify import map_distinct
from tptune.trace.intervals import outermost
from tptune.trace.load import LoadedTrace

FORWARD, BACKWARD = "forward", "backward"
_NODE_PREFIX = "autograd::engine::evaluate_function: "
_BACKWARD_OP = re.compile(r"Backward\d*$")


def step_ranges(trace: LoadedTrace, pats: Mapping[str, re.Pattern]) -> pl.DataFrame:
    """ProfilerStep ranges: step, tid, s_start, s_end (sorted by s_start)."""
    def step_of(name: str) -> int | None:
        m = pats["step"].search(name)
        return int(m.group(1)) if m else None

    return (
        trace.cpu.with_columns(step=map_distinct(trace.cpu["name"], step_of, pl.Int64))
        .filter(pl.col("step").is_not_null())
        .select(
            "step",
            "tid",
            pl.col("ts").alias("s_start"),
            (pl.col("ts") + pl.col("dur")).alias("s_end"),
        )
        .sort("s_start")
    )


def phase_markers(trace: LoadedTrace, pats: Mapping[str, re.Pattern]) -> pl.DataFrame:
    """Outermost forward/backward marker ranges per thread: tid, m_start, m_end, phase, marker."""
    def phase_of(name: str) -> str | None:
        # Backward first: "_LinearBackward" must not be read as the forward "_Linear".
        if pats["backward"].search(name):
            return BACKWARD
        if pats["forward"].search(name):
            return FORWARD
        return None

    m = (
        trace.cpu.with_columns(phase=map_distinct(trace.cpu["name"], phase_of, pl.String))
        .filter(pl.col("phase").is_not_null())
        .select(
            "tid",
            pl.col("ts").alias("m_start"),
            (pl.col("ts") + pl.col("dur")).alias("m_end"),
            "phase",
            pl.col("name").cast(pl.String).alias("marker"),
        )
    )
    if m.height == 0:
        return m
    return m.filter(outermost(m, ["tid"], "m_start", "m_end")).sort("m_start")


def backward_nodes(trace: LoadedTrace) -> pl.DataFrame:
    """Outermost autograd node ranges per thread (tid, m_start, m_end): the unit
    within which dgrad and wgrad GEMMs are told apart."""
    is_node = map_distinct(
        trace.cpu["name"], lambda n: n.startswith(_NODE_PREFIX) or bool(_BACKWARD_OP.search(n)), pl.Boolean
    )
    m = trace.cpu.filter(is_node).select(
        "tid", pl.col("ts").alias("m_start"), (pl.col("ts") + pl.col("dur")).alias("m_end")
    )
    if m.height == 0:
        return m
    return m.filter(outermost(m, ["tid"], "m_start", "m_end")).sort("m_start")


def _in_window(df: pl.DataFrame, ranges: pl.DataFrame, start: str, end: str, by: str | None) -> pl.DataFrame:
    """join_asof of df.point onto ranges[start], nulling ranges that end before the point."""
    joined = df.sort("point").join_asof(
        ranges.sort(start), left_on="point", right_on=start, by=by, strategy="backward", check_sortedness=False
    )
    cols = [c for c in ranges.columns if c not in (by,)]
    outside = pl.col(end).is_null() | (pl.col("point") > pl.col(end))
    return joined.with_columns([pl.when(outside).then(None).otherwise(pl.col(c)).alias(c) for c in cols])


def attribute(
    events: pl.DataFrame, trace: LoadedTrace, pats: Mapping[str, re.Pattern], *, main_tid: int | None = None
) -> pl.DataFrame:
    """Add step, phase, marker, group (id of the autograd node) to
    ``events``, which must carry ``point`` (launch time) and ``ptid`` (launch
    thread); events with a null point get null attribution."""
    steps = step_ranges(trace, pats)
    markers = phase_markers(trace, pats)
    if main_tid is None and steps.height:
        main_tid = steps["tid"].mode().sort()[0]
    events = events.rename({"tid": "_etid"})
    known = events.filter(pl.col("point").is_not_null())
    unknown = events.filter(pl.col("point").is_null())

    if steps.height:
        known = _in_window(known, steps.select("step", "s_start", "s_end"), "s_start", "s_end", None).drop(
            "s_start", "s_end"
        )
    else:
        known = known.with_columns(step=pl.lit(None, dtype=pl.Int64))

    own = _in_window(
        known.rename({"ptid": "tid"}), markers.select("tid", "m_start", "m_end", "phase", "marker"),
        "m_start", "m_end", "tid",
    ).rename({"tid": "ptid"}).drop("m_start", "m_end")
    main = markers.filter(pl.col("tid") == main_tid) if main_tid is not None else markers.clear()
    fallback = _in_window(
        own.filter(pl.col("phase").is_null()).drop("phase", "marker"),
        main.select("m_start", "m_end", "phase", "marker"), "m_start", "m_end", None,
    ).drop("m_start", "m_end")
    known = pl.concat([own.filter(pl.col("phase").is_not_null()), fallback], how="vertical_relaxed")
    # A node's start time (ns) identifies it well enough.
    nodes = backward_nodes(trace).with_columns(group=pl.col("m_start"))
    known = _in_window(
        known.rename({"ptid": "tid"}), nodes.select("tid", "m_start", "m_end", "group"), "m_start", "m_end", "tid"
    ).rename({"tid": "ptid"}).drop("m_start", "m_end")
    unknown = unknown.with_columns(
        step=pl.lit(None, dtype=pl.Int64),
        phase=pl.lit(None, dtype=pl.String),
        marker=pl.lit(None, dtype=pl.String),
        group=pl.lit(None, dtype=pl.Int64),
    )
    out = pl.concat([known, unknown.select(known.columns)], how="vertical_relaxed")
    return out.rename({"_etid": "tid"}).sort("ts")


def attribute_gpu(trace: LoadedTrace, gpu: pl.DataFrame, pats: Mapping[str, re.Pattern]) -> pl.DataFrame:
    """GPU events with launch (point, ptid) and step/phase/marker/group."""
    launches = (
        trace.runtime.filter(pl.col("correlation").is_not_null())
        .select("correlation", pl.col("ts").alias("point"), pl.col("tid").alias("ptid"))
        .unique("correlation", keep="first")
    )
    with_launch = gpu.join(launches, on="correlation", how="left")
    return attribute(with_launch, trace, pats)


def attribute_cpu(trace: LoadedTrace, ops: pl.DataFrame, pats: Mapping[str, re.Pattern]) -> pl.DataFrame:
    """CPU-only trace: each classified op is its own 'launch'."""
    return attribute(ops.with_columns(point=pl.col("ts"), ptid=pl.col("tid")), trace, pats)
