"""Kernel (and CPU op) classes from names and categories.

All patterns live in DEFAULT_PATTERNS; callers override any of them with
``patterns=`` (merged over the defaults). Classification runs once per distinct
name, never per event.

Unlike HTA (which calls a kernel communication only if its name starts with
``nccl``), TE userbuffers, peer-to-peer memcpy and PyTorch symmetric-memory
kernels are communication here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

GEMM, COMM, OTHER, MEMCPY, MEMSET = "gemm", "comm", "other", "memcpy", "memset"
CLASSES = (GEMM, COMM, OTHER, MEMCPY, MEMSET)

DEFAULT_PATTERNS: dict[str, str] = {
    # GPU kernels and memory operations (checked in this order: comm, gemm, memcpy, memset).
    "comm": (
        r"^(void )?k?userbuffers_"
        r"|ncclDevKernel_|ncclKernel_"
        r"|c10d::symmetric_memory::"
        r"|^Memcpy PtoP"
        r"|multimem_all_|(one|two)_shot_all_reduce|cross_device_reduce"
    ),
    "gemm": (
        r"(?i)nvjet_|gemm|gemv|xmma_|cutlass.*(tensorop|wgmma|_mma)"
        r"|cublas(Lt)?|s\d+gemm|sgemm|hgemm|triton_\w*_mm_|matmul_kernel"
    ),
    "memcpy": r"^Memcpy ",
    "memset": r"^Memset",
    # CPU-only traces: ops on the CPU threads stand in for kernels.
    "cpu_gemm": r"^aten::(mm|addmm|matmul|bmm|baddbmm|linear)$",
    "cpu_comm": (
        r"^(c10d::|gloo:|nccl:|tptune\.comm\.)|^record_param_comms$"
        r"|^(aten::|c10d::|_)?(all_gather|allgather|reduce_scatter|all_reduce|allreduce)"
    ),
    # Phase markers (CPU ranges); see phases.py.
    "forward": (
        r"^tptune\.forward$|^_(LayerNorm)?Linear$|^_LayerNormMLP$|^_GroupedLinear$"
        r"|^symm_mem::fused_"
    ),
    "backward": r"^tptune\.backward$|^autograd::engine::evaluate_function: |Backward\d*$",
    "step": r"^ProfilerStep#(\d+)$",
}


def merged_patterns(patterns: Mapping[str, str] | None = None) -> dict[str, re.Pattern]:
    unknown = set(patterns or {}) - set(DEFAULT_PATTERNS)
    if unknown:
        raise ValueError(f"unknown pattern keys {sorted(unknown)}; known: {sorted(DEFAULT_PATTERNS)}")
    merged = {**DEFAULT_PATTERNS, **(patterns or {})}
    return {k: re.compile(v) for k, v in merged.items()}


def classify_name(name: str, pats: Mapping[str, re.Pattern]) -> str:
    """Class of one GPU event (kernel / gpu_memcpy / gpu_memset) from its name."""
    if pats["comm"].search(name):
        return COMM
    if pats["memset"].search(name):
        return MEMSET
    if pats["memcpy"].search(name):
        return MEMCPY
    if pats["gemm"].search(name):
        return GEMM
    return OTHER


def classify_cpu_name(name: str, pats: Mapping[str, re.Pattern]) -> str | None:
    """Class of one CPU op in a CPU-only trace; None for ops we ignore."""
    if pats["cpu_comm"].search(name):
        return COMM
    if pats["cpu_gemm"].search(name):
        return GEMM
    return None


def map_distinct(names: pl.Series, fn, dtype) -> pl.Series:
    """fn applied once per distinct value of a Categorical column (aligned with it).

    Works on the categorical codes: casting millions of rows to strings is
    what would cost time, not the few thousand distinct names."""
    if names.dtype != pl.Categorical:
        names = names.cast(pl.Categorical)
    codes = names.to_physical()
    distinct = pl.DataFrame({"code": codes, "name": names}).unique("code")
    table = {c: fn(n) for c, n in zip(distinct["code"], distinct["name"].cast(pl.String))}
    return codes.replace_strict(table, default=None, return_dtype=dtype).alias(names.name)


def classify(events: pl.DataFrame, patterns: Mapping[str, str] | None = None, *, cpu: bool = False) -> pl.DataFrame:
    """Add a ``cls`` column to a frame of GPU events (or, with ``cpu=True``, of
    CPU ops, where unclassified ops get a null ``cls``)."""
    pats = merged_patterns(patterns)
    if events.height == 0:
        return events.with_columns(cls=pl.lit(None, dtype=pl.String))
    if cpu:
        cls = map_distinct(events["name"], lambda n: classify_cpu_name(n, pats), pl.String)
    else:
        cls = map_distinct(events["name"], lambda n: classify_name(n, pats), pl.String)
    return events.with_columns(cls.alias("cls"))
