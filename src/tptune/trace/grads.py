"""Tell dgrad from wgrad GEMMs within each backward autograd node.

1. ``layout``: cuBLAS layout letters in the kernel name (nvjet ``..._NNT``,
   xmma/ampere ``..._nn_...``). Transformer Engine calls fprop "TN", dgrad "NN",
   wgrad "NT"; used when a node has both NN and NT GEMMs.
2. ``order``: a node with exactly two GEMM launches computes dgrad first, then
   wgrad (TE's _LinearBackward and torch's MmBackward both do).
3. ``unknown`` otherwise; such GEMMs count in neither dgrad_ms nor wgrad_ms.
"""

from __future__ import annotations

import re

import polars as pl

from tptune.trace.classify import map_distinct

DGRAD, WGRAD = "dgrad", "wgrad"
_LAYOUT = re.compile(r"(?:^|_)([NnTt]{2})[NnTt]?(?=_|$)")
_RANK = {"layout": 0, "order": 1, "unknown": 2}


def _layout(name: str) -> str | None:
    found = _LAYOUT.findall(name)
    return found[-1].upper() if found else None


def split_grads(ev: pl.DataFrame) -> pl.DataFrame:
    """Add ``grad`` (dgrad/wgrad/null) and ``grad_split`` (method, per node) to
    ev, for backward GEMMs that have a ``group`` (autograd node id)."""
    is_bwd_gemm = (pl.col("phase") == "backward") & (pl.col("cls") == "gemm") & pl.col("group").is_not_null()
    rest = ev.filter(~is_bwd_gemm.fill_null(False)).with_columns(
        grad=pl.lit(None, dtype=pl.String), grad_split=pl.lit(None, dtype=pl.String)
    )
    bg = ev.filter(is_bwd_gemm.fill_null(False))
    bg = bg.with_columns(_layout=map_distinct(bg["name"], _layout, pl.String)).sort("point")
    per_node = bg.group_by("group").agg(
        _n=pl.len(), _nn=(pl.col("_layout") == "NN").any(), _nt=(pl.col("_layout") == "NT").any()
    )
    method = (
        pl.when(pl.col("_nn") & pl.col("_nt"))
        .then(pl.lit("layout"))
        .when(pl.col("_n") == 2)
        .then(pl.lit("order"))
        .otherwise(pl.lit("unknown"))
    )
    bg = bg.join(per_node.select("group", method.alias("grad_split")), on="group", how="left").with_columns(
        _order=pl.int_range(pl.len()).over("group")
    )
    grad = (
        pl.when(pl.col("grad_split") == "layout")
        .then(pl.col("_layout").replace_strict({"NN": DGRAD, "NT": WGRAD}, default=None))
        .when(pl.col("grad_split") == "order")
        .then(pl.when(pl.col("_order") == 0).then(pl.lit(DGRAD)).otherwise(pl.lit(WGRAD)))
    )
    bg = bg.with_columns(grad=grad).drop("_layout", "_order")
    return pl.concat([rest, bg.select(rest.columns)], how="vertical_relaxed")


def worst_method(methods: pl.Expr) -> pl.Expr:
    """Weakest split method among a row's nodes (layout < order < unknown)."""
    ranked = methods.replace_strict(_RANK, default=None, return_dtype=pl.Int8).max()
    return ranked.replace_strict({v: k for k, v in _RANK.items()}, default=None, return_dtype=pl.String)
