"""Tell dgrad from wgrad GEMMs within each backward autograd node.

1. ``layout``: cuBLAS layout letters in the kernel name (nvjet ``..._NNT``,
   xmma/ampere ``..._nn_...``). Transformer Engine calls fprop "TN", dgrad "NN",
   wgrad "NT"; used when a node has both NN and NT GEMMs.
2. ``order``: a node with exactly two GEMM launches computes dgrad first, then
   wgrad (TE's _LinearBackward and torch's MmBackward both do).
3. ``unknown`` otherwise; such GEMMs count in neither dgrad_ms nor wgrad_ms.
"""

from __future__ import annotations

import polars as pl

DGRAD, WGRAD = "dgrad", "wgrad"
_LAYOUT = r"(?:^|_)[NnTt]{2,3}(?:_|$)"
_RANK = {"layout": 0, "order": 1, "unknown": 2}


def split_grads(ev: pl.DataFrame) -> pl.DataFrame:
    """Add ``grad`` (dgrad/wgrad/null) and ``grad_split`` (method, per node) to
    ev, for backward GEMMs that have a ``group`` (autograd node id)."""
    is_bwd_gemm = (pl.col("phase") == "backward") & (pl.col("cls") == "gemm") & pl.col("group").is_not_null()
    token = pl.col("name").cast(pl.String).str.extract_all(_LAYOUT).list.last()
    layout = token.str.replace_all("_", "").str.slice(0, 2).str.to_uppercase()
    ev = ev.with_columns(
        _layout=pl.when(is_bwd_gemm).then(layout),
        _order=pl.when(is_bwd_gemm).then(pl.col("point").rank("ordinal").over("group")),
        _n=pl.when(is_bwd_gemm).then(pl.len().over("group", is_bwd_gemm)),
    )
    by_layout = (
        pl.col("_layout").is_in(["NN"]).any().over("group") & pl.col("_layout").is_in(["NT"]).any().over("group")
    )
    method = (
        pl.when(~is_bwd_gemm)
        .then(None)
        .when(by_layout)
        .then(pl.lit("layout"))
        .when(pl.col("_n") == 2)
        .then(pl.lit("order"))
        .otherwise(pl.lit("unknown"))
    )
    ev = ev.with_columns(grad_split=method)
    grad = (
        pl.when(pl.col("grad_split") == "layout")
        .then(pl.col("_layout").replace_strict({"NN": DGRAD, "NT": WGRAD}, default=None))
        .when(pl.col("grad_split") == "order")
        .then(pl.when(pl.col("_order") == 1).then(pl.lit(DGRAD)).otherwise(pl.lit(WGRAD)))
    )
    return ev.with_columns(grad=grad).drop("_layout", "_order", "_n")


def worst_method(methods: pl.Expr) -> pl.Expr:
    """Weakest split method among a row's nodes (layout < order < unknown)."""
    ranked = methods.replace_strict(_RANK, default=None, return_dtype=pl.Int8).max()
    return ranked.replace_strict({v: k for k, v in _RANK.items()}, default=None, return_dtype=pl.String)
