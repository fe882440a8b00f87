"""Exact, vectorised interval set arithmetic on integer-ns intervals.

Per group: sort by start, a new merged segment begins where start exceeds the
running maximum of earlier ends. |A ∩ B| = |A| + |B| - |A ∪ B| for unions A, B.
"""

from __future__ import annotations

import polars as pl


def merged_segments(df: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Union of the intervals of each group as disjoint segments (by..., start, end)."""
    if df.height == 0:
        return df.select(*by, start, end)
    prev_end = pl.col(end).cum_max().shift(1).over(by)
    return (
        df.select(*by, start, end)
        .sort([*by, start])
        .with_columns(_new=(prev_end.is_null() | (pl.col(start) > prev_end)))
        .with_columns(_seg=pl.col("_new").cum_sum().over(by))
        .group_by([*by, "_seg"])
        .agg(pl.col(start).min(), pl.col(end).max())
        .drop("_seg")
        .sort([*by, start])
    )


def union_length(df: pl.DataFrame, by: list[str], name: str = "length") -> pl.DataFrame:
    """Total length of the union of each group's intervals: (by..., name)."""
    seg = merged_segments(df, by)
    return seg.group_by(by).agg((pl.col("end") - pl.col("start")).sum().alias(name))


def outermost(df: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.Series:
    """Boolean mask (in df's row order) of intervals not nested inside an
    earlier-starting interval of the same group."""
    idx = pl.int_range(pl.len()).alias("_row")
    prev_end = pl.col(end).cum_max().shift(1).over(by)
    # Ties on start: the longer one is the outer one.
    return (
        df.with_columns(idx)
        .sort([*by, start, end], descending=[False] * len(by) + [False, True])
        .with_columns(_top=(prev_end.is_null() | (pl.col(start) >= prev_end)))
        .sort("_row")["_top"]
    )
