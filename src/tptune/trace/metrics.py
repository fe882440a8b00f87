"""Per rank/step/phase overlap metrics, and their summary over ranks and steps."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

import polars as pl

from tptune.trace.classify import COMM, GEMM, OTHER, classify, merged_patterns
from tptune.trace.grads import DGRAD, WGRAD, split_grads, worst_method
from tptune.trace.intervals import outermost, union_length
from tptune.trace.load import LoadedTrace, load_trace
from tptune.trace.phases import attribute_cpu, attribute_gpu, phase_markers, step_ranges

KEY = ["step", "phase"]
TIME_COLUMNS = ["wall_ms", "gemm_ms", "comm_ms", "overlap_ms", "exposed_comm_ms", "other_ms"]
COLUMNS = ["rank", "step", "phase", *TIME_COLUMNS, "gemm_streams", "comm_streams"]
EXTRA_COLUMNS = ["dgrad_ms", "wgrad_ms", "grad_split", "n_kernels", "device"]


def attributed_events(trace: LoadedTrace, patterns: Mapping[str, str] | None = None) -> pl.DataFrame:
    """Classified events with step/phase/grad: start, end, name, cls, unit
    (stream, or thread in CPU traces), step, phase, group, grad, grad_split."""
    pats = merged_patterns(patterns)
    if not trace.cpu_only:
        ev = attribute_gpu(trace, classify(trace.gpu, patterns), pats).with_columns(unit=pl.col("stream"))
    else:
        ops = classify(trace.cpu, patterns, cpu=True)
        ops = ops.filter(pl.col("cls").is_not_null())
        # Nested gemm/comm ops (aten::linear > aten::matmul > aten::mm) count once.
        ops = ops.with_columns(start=pl.col("ts"), end=pl.col("ts") + pl.col("dur"))
        ops = ops.filter(outermost(ops, ["tid"]))
        ev = attribute_cpu(trace, ops.drop("start", "end"), pats).with_columns(unit=pl.col("tid"))
    ev = ev.with_columns(start=pl.col("ts"), end=pl.col("ts") + pl.col("dur"))
    return split_grads(ev)


def _phase_walls_cpu(trace: LoadedTrace, patterns) -> pl.DataFrame:
    """CPU traces: a phase's wall time is the span of its marker ranges in the step."""
    pats = merged_patterns(patterns)
    steps = step_ranges(trace, pats)
    marks = phase_markers(trace, pats)
    if steps.height == 0 or marks.height == 0:
        return pl.DataFrame(schema={"step": pl.Int64, "phase": pl.String, "wall": pl.Int64})
    m = marks.sort("m_start").join_asof(steps.select("step", "s_start", "s_end"), left_on="m_start", right_on="s_start")
    m = m.filter(pl.col("m_start") <= pl.col("s_end"))
    return m.group_by(KEY).agg(wall=pl.col("m_end").max() - pl.col("m_start").min())


def _streams(ev: pl.DataFrame, cls: str, name: str) -> pl.DataFrame:
    return (
        ev.filter(pl.col("cls") == cls)
        .group_by(KEY)
        .agg(pl.col("unit").unique().sort().cast(pl.String).str.join(",").alias(name))
    )


def rank_metrics(
    trace: LoadedTrace, patterns: Mapping[str, str] | None = None, drop_truncated_last: bool = True
) -> pl.DataFrame:
    """One row per (step, phase) of one rank's trace; see COLUMNS and EXTRA_COLUMNS."""
    ev = attributed_events(trace, patterns).filter(pl.col("step").is_not_null() & pl.col("phase").is_not_null())
    to_ms = 1e-6
    rows = ev.group_by(KEY).agg(
        wall=pl.col("end").max() - pl.col("start").min(),
        n_kernels=pl.len(),
        grad_split=worst_method(pl.col("grad_split").drop_nulls()),
    )
    if trace.cpu_only:
        walls = _phase_walls_cpu(trace, patterns)
        rows = rows.join(walls, on=KEY, how="left", suffix="_r").with_columns(
            wall=pl.coalesce("wall_r", "wall")
        ).drop("wall_r")
    lengths = union_length(ev.filter(pl.col("cls").is_in([GEMM, COMM, OTHER])), [*KEY, "cls"]).pivot(
        on="cls", index=KEY, values="length"
    )
    both = union_length(ev.filter(pl.col("cls").is_in([GEMM, COMM])), KEY, "gemm_or_comm")
    grads = union_length(ev.filter(pl.col("grad").is_not_null()), [*KEY, "grad"]).pivot(
        on="grad", index=KEY, values="length"
    )
    for frame_cols, frame in ((("gemm", "comm", "other"), lengths), ((DGRAD, WGRAD), grads)):
        for c in frame_cols:
            if c not in frame.columns:
                frame = frame.with_columns(pl.lit(None, dtype=pl.Int64).alias(c))
        rows = rows.join(frame.select(*KEY, *frame_cols), on=KEY, how="left")
    rows = rows.join(both, on=KEY, how="left").with_columns(
        pl.col("gemm", "comm", "other", "gemm_or_comm").fill_null(0)
    )
    rows = rows.join(_streams(ev, GEMM, "gemm_streams"), on=KEY, how="left").join(
        _streams(ev, COMM, "comm_streams"), on=KEY, how="left"
    )
    overlap = pl.col("gemm") + pl.col("comm") - pl.col("gemm_or_comm")
    is_bwd = pl.col("phase") == "backward"
    out = rows.select(
        pl.lit(trace.rank, dtype=pl.Int64).alias("rank"),
        "step",
        "phase",
        (pl.col("wall") * to_ms).alias("wall_ms"),
        (pl.col("gemm") * to_ms).alias("gemm_ms"),
        (pl.col("comm") * to_ms).alias("comm_ms"),
        (overlap * to_ms).alias("overlap_ms"),
        ((pl.col("comm") - overlap) * to_ms).alias("exposed_comm_ms"),
        (pl.col("other") * to_ms).alias("other_ms"),
        pl.col("gemm_streams").fill_null(""),
        pl.col("comm_streams").fill_null(""),
        pl.when(is_bwd & (pl.col("grad_split") != "unknown")).then(pl.col(DGRAD).fill_null(0) * to_ms).alias("dgrad_ms"),
        pl.when(is_bwd & (pl.col("grad_split") != "unknown")).then(pl.col(WGRAD).fill_null(0) * to_ms).alias("wgrad_ms"),
        pl.when(is_bwd).then(pl.col("grad_split").fill_null("unknown")).alias("grad_split"),
        pl.col("n_kernels").cast(pl.Int64),
        pl.lit("cpu" if trace.cpu_only else "gpu").alias("device"),
    ).sort(KEY)
    if drop_truncated_last:
        out = _drop_truncated_last(out)
    return out


def _drop_truncated_last(df: pl.DataFrame) -> pl.DataFrame:
    """Drop the last step when there are ≥2 steps and it looks cut off: it lacks
    a phase the other steps have, or has fewer kernels in a phase than any of them."""
    steps = df["step"].unique().sort()
    if len(steps) < 2:
        return df
    last = steps[-1]
    prev, tail = df.filter(pl.col("step") != last), df.filter(pl.col("step") == last)
    if not set(prev["phase"]) <= set(tail["phase"]):
        return prev
    fewest = prev.group_by("phase").agg(pl.col("n_kernels").min().alias("_min"))
    cut = tail.join(fewest, on="phase").filter(pl.col("n_kernels") < pl.col("_min"))
    return prev if cut.height else df


def trace_metrics(
    paths: Iterable[str | Path | LoadedTrace],
    patterns: Mapping[str, str] | None = None,
    drop_truncated_last: bool = True,
) -> pl.DataFrame:
    """Metrics of several ranks' traces: one row per (rank, step, phase)."""
    frames = []
    for i, p in enumerate(paths):
        trace = load_trace(p)
        m = rank_metrics(trace, patterns, drop_truncated_last)
        if trace.rank is None:
            m = m.with_columns(rank=pl.lit(i, dtype=pl.Int64))
        frames.append(m)
        del trace
    if not frames:
        raise ValueError("trace_metrics needs at least one trace")
    return pl.concat(frames, how="vertical_relaxed").select(*COLUMNS, *EXTRA_COLUMNS).sort("rank", *KEY)


def summarize(df: pl.DataFrame) -> pl.DataFrame:
    """Per phase: for each time metric, max and mean over ranks (per step),
    then the median of those over steps. Columns: phase, n_ranks, n_steps,
    <metric>_max, <metric>_mean for each metric in TIME_COLUMNS (+ dgrad/wgrad)."""
    metrics = [c for c in [*TIME_COLUMNS, "dgrad_ms", "wgrad_ms"] if c in df.columns]
    per_step = df.group_by(KEY).agg(
        pl.col("rank").n_unique().alias("n_ranks"),
        *[pl.col(c).max().alias(f"{c}_max") for c in metrics],
        *[pl.col(c).mean().alias(f"{c}_mean") for c in metrics],
    )
    stat_cols = [f"{c}_{s}" for c in metrics for s in ("max", "mean")]
    return (
        per_step.group_by("phase")
        .agg(pl.col("n_ranks").max(), pl.col("step").n_unique().alias("n_steps"), *[pl.col(c).median() for c in stat_cols])
        .sort("phase", descending=True)
    )
