"""Exact, vectorised interval set arithmetic on integer-ns intervals.

Union per group: sort by start, a new merged segment begins where start
exceeds the running maximum of earlier ends. |A ∩ B| = |A| + |B| - |A ∪ B|.

Speed: polars sorts on several columns are slow, so the group id is packed
into the high bits of one Int64 key (group << bits | time - t0). Keys of a later
group always exceed those of an earlier one, so one global sort and one global
running maximum give the per-group result.
"""

from __future__ import annotations

import polars as pl

_MAX_BITS = 62


def _group_id(by: list[str]) -> pl.Expr:
    if not by:
        return pl.lit(0, dtype=pl.Int64)
    if len(by) == 1:
        return pl.col(by[0]).rank("dense").cast(pl.Int64) - 1
    # rank of a struct is slow; of its 64-bit hash fast (collisions: negligible for a few groups).
    return pl.struct(by).hash().rank("dense").cast(pl.Int64) - 1


def merged_segments(df: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.DataFrame:
    """Union of the intervals of each group as disjoint segments (by..., start, end),
    sorted by group then start."""
    if df.height == 0:
        return df.select(*by, start, end)
    d = df.select(*by, start, end).with_columns(_g=_group_id(by))
    lo, hi = d[start].min(), d[end].max()
    n_groups = d["_g"].max() + 1
    bits = max(int(hi - lo).bit_length(), 1)
    if bits + max(int(n_groups).bit_length(), 1) > _MAX_BITS:
        return _merged_segments_slow(d, by, start, end)
    shift = pl.col("_g") * (1 << bits)
    keys = d.select("_g", (shift + pl.col(start) - lo).alias("_ks"), (shift + pl.col(end) - lo).alias("_ke")).sort("_ks")
    prev_end = pl.col("_ke").cum_max().shift(1)
    seg = (
        keys.with_columns(_s=(prev_end.is_null() | (pl.col("_ks") > prev_end)).cum_sum())
        .group_by("_s")
        .agg(pl.col("_g").first(), pl.col("_ks").min(), pl.col("_ke").max())
        .select("_g", (pl.col("_ks") - pl.col("_g") * (1 << bits) + lo).alias(start),
                (pl.col("_ke") - pl.col("_g") * (1 << bits) + lo).alias(end))
    )
    if by:
        groups = d.group_by("_g").agg(pl.col(by).first())
        seg = seg.join(groups, on="_g")
    return seg.sort(["_g", start]).select(*by, start, end)


def _merged_segments_slow(d: pl.DataFrame, by: list[str], start: str, end: str) -> pl.DataFrame:
    prev_end = pl.col(end).cum_max().shift(1).over("_g")
    return (
        d.sort(["_g", start])
        .with_columns(_new=(prev_end.is_null() | (pl.col(start) > prev_end)))
        .with_columns(_seg=pl.col("_new").cum_sum())
        .group_by("_seg")
        .agg(pl.col("_g").first(), *[pl.col(c).first() for c in by], pl.col(start).min(), pl.col(end).max())
        .sort(["_g", start])
        .select(*by, start, end)
    )


def union_length(df: pl.DataFrame, by: list[str], name: str = "length") -> pl.DataFrame:
    """Total length of the union of each group's intervals: (by..., name).

    Each interval, in start order, adds the part of it beyond the running
    maximum of earlier ends."""
    if df.height == 0:
        return df.select(*by).with_columns(pl.lit(0, dtype=pl.Int64).alias(name)).head(0)
    d = df.select(*by, "start", "end").with_columns(_g=_group_id(by))
    lo, hi = d["start"].min(), d["end"].max()
    n_groups = d["_g"].max() + 1
    bits = max(int(hi - lo).bit_length(), 1)
    if bits + max(int(n_groups).bit_length(), 1) > _MAX_BITS:
        seg = merged_segments(df, by)
        return seg.group_by(by or pl.lit(0)).agg((pl.col("end") - pl.col("start")).sum().alias(name)).select(*by, name)
    shift = pl.col("_g") * (1 << bits)
    keys = d.select("_g", (shift + pl.col("start") - lo).alias("_ks"), (shift + pl.col("end") - lo).alias("_ke"))
    prev_end = pl.col("_ke").cum_max().shift(1).fill_null(-1)
    gain = (pl.col("_ke") - pl.max_horizontal("_ks", prev_end)).clip(lower_bound=0)
    per_group = keys.sort("_ks").group_by("_g").agg(gain.sum().alias(name))
    if not by:
        return per_group.select(name)
    groups = d.group_by("_g").agg(pl.col(by).first())
    return per_group.join(groups, on="_g").select(*by, name)


def outermost(df: pl.DataFrame, by: list[str], start: str = "start", end: str = "end") -> pl.Series:
    """Boolean mask (in df's row order) of intervals not nested inside an
    earlier-starting interval of the same group. Ties on start: the longer
    interval is the outer one."""
    if df.height == 0:
        return pl.Series([], dtype=pl.Boolean)
    d = df.select(*by, start, end).with_row_index("_row").with_columns(_g=_group_id(by))
    lo, hi = d[start].min(), d[end].max()
    bits = max(int(hi - lo).bit_length(), 1)
    if bits + max(int(d["_g"].max() + 1).bit_length(), 1) > _MAX_BITS:
        prev_end = pl.col(end).cum_max().shift(1).over(by)
        return (
            d.sort([*by, start, end], descending=[False] * len(by) + [False, True])
            .with_columns(_top=(prev_end.is_null() | (pl.col(start) >= prev_end)))
            .sort("_row")["_top"]
        )
    shift = pl.col("_g") * (1 << bits)
    # Two single-column sorts (stable) instead of one slow multi-column sort.
    keyed = (
        d.select("_row", (shift + pl.col(start) - lo).alias("_ks"), (shift + pl.col(end) - lo).alias("_ke"))
        .sort("_ke", descending=True)
        .sort("_ks", maintain_order=True)
    )
    prev_end = pl.col("_ke").cum_max().shift(1)
    return keyed.with_columns(_top=(prev_end.is_null() | (pl.col("_ks") >= prev_end))).sort("_row")["_top"]
