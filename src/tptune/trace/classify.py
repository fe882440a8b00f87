"""Kernel (and CPU op) classes from names and categories.

All patterns live in DEFAULT_PATTERNS; callers override any of them with
``patterns=`` (merged over the defaults). Classification runs once per distinct
name, never per event.

Unlike HTA (which calls a kernel communication only if its name starts with
``nccl``), TE userbuffers, peer-to-peer memcpy and PyTorch symmetric-memory
kernels are communication here.

FP8 (Transformer Engine) traces hold two more kinds of kernels that are neither the op's GEMMs nor
its TP communication, with their own classes so that GEMM time and exposed TP communication stay
exact:
- ``quant``: quantization work: casts to FP8/FP4 (fused with transposes for the column-wise copy
  the backward GEMMs need), transposes of FP8 data, amax computation, scale updates (delayed
  scaling's amax-history/scale kernel), block/MX scale swizzles. Names from TE 2.20's kernels
  (NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b, transformer_engine/common/:
  transpose/cast_transpose*.cu (cast_transpose_optimized_kernel, cast_transpose_fused_kernel_notaligned,
  multi_cast_transpose_kernel, transpose_optimized_kernel), transpose/quantize_transpose_*_blockwise.cu
  (block_scaled_cast_transpose_kernel, block_scaled_1d_cast_transpose_kernel), cast/fp8/quantize_fp8.cuh
  (cast_fp8_1D_kernel, cast_fp8_2D_kernel), cast/mxfp8/ (quantize_mxfp8_kernel, ...), cast/nvfp4/,
  recipe/current_scaling.cu (amax_kernel, zero_amax_kernel, compute_scale_from_amax_kernel),
  recipe/delayed_scaling.cu (delayed_scaling_recipe::...::kernel, kernel_bulk), swizzle/).
  A norm that writes FP8 (rmsnorm_fwd_*) stays ``other``: it is the norm.
- ``amax_comm``: the all-reduce (MAX) of amaxes across the TP group: delayed scaling's amax history
  at the end of each forward/backward, and current scaling's input amax before a sequence-parallel
  FP8 all-gather. NCCL runs every f32 all-reduce, MAX included, in its kernel specialised for Sum
  (NVIDIA/nccl@5067397c2676d5aed50042fc39e5c8ee96eb0027 src/device/generate.py best_kernel:
  ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``), so the name cannot tell an amax all-reduce from any
  other f32 all-reduce. The default ``amax_comm`` pattern matches nothing; ``fp8_patterns(recipe)``
  gives the overlay for an FP8 run, where a TP layer (sequence parallel: all-gathers and
  reduce-scatters, in bf16 or FP8) has no other f32 all-reduce. The te backend also runs TE's amax
  all-reduce inside the CPU range ``tptune.fp8.amax_reduce`` (pattern ``amax_mark``), for exact
  attribution by launch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import polars as pl

GEMM, COMM, OTHER, MEMCPY, MEMSET = "gemm", "comm", "other", "memcpy", "memset"
QUANT, AMAX_COMM = "quant", "amax_comm"
CLASSES = (GEMM, COMM, OTHER, MEMCPY, MEMSET, QUANT, AMAX_COMM)
NEVER = r"(?!)"
# NCCL all-reduce kernels of f32 data (amaxes are f32): NCCL >= 2.19 names, and the older ones.
NCCL_F32_ALLREDUCE = r"^ncclDevKernel_AllReduce_\w+_f32_|^ncclKernel_AllReduce_\w+_(f32|float)\b"
# Recipes whose step all-reduces amaxes over the TP group (block/MX scales are local).
AMAX_REDUCING_RECIPES = ("delayed", "current", "nvfp4")

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
    # TE quantization kernels (see the module doc), checked before "gemm".
    "quant": (
        r"cast_transpose|transpose_(optimized|general)_kernel|transpose_dbias_kernel"
        r"|cast_fp8_[12]D_kernel|group_cast_fp8|cast_fp8_gated_kernel"
        r"|quantize_(transpose_)?(mxfp8|nvfp4|gated_mxfp8)|quantize_mxfp8|dequantize_(mxfp8|fp4|blockwise)"
        r"|group_(de)?quantize_|block_scaled_|fused_group_requantize|quantize_4over6"
        r"|(mxfp8|nvfp4|fp8_block)_scaling_|nvfp4_\w+_kernel|compute_nvfp4_per_tensor_scale"
        r"|(^|\W)(zero_)?amax_kernel|compute_scale_from_amax|compute_columnwise_amax|partial_amax"
        r"|delayed_scaling_recipe::|swizzle_(row|col|block)?_?scaling|swizzle_block_scaling"
        r"|Hadamard(Amax|Transform)|ZeroAmaxKernel|MultiAmax|rht_gemm_device"
    ),
    # FP8 amax all-reduces: nothing by default; fp8_patterns() gives the FP8 run's overlay.
    "amax_comm": NEVER,
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
    # CPU range around TE's amax all-reduce (te backend, FP8): launches inside it are AMAX_COMM.
    "amax_mark": r"^tptune\.fp8\.amax_reduce$",
}


def fp8_patterns(recipe: str | None) -> dict[str, str]:
    """The pattern overlay for an FP8 run's traces (pass as ``patterns=``): NCCL f32 all-reduces are
    amax reductions under the recipes that reduce amaxes; {} for other recipes and non-FP8 runs."""
    return {"amax_comm": NCCL_F32_ALLREDUCE} if recipe in AMAX_REDUCING_RECIPES else {}


def merged_patterns(patterns: Mapping[str, str] | None = None) -> dict[str, re.Pattern]:
    unknown = set(patterns or {}) - set(DEFAULT_PATTERNS)
    if unknown:
        raise ValueError(f"unknown pattern keys {sorted(unknown)}; known: {sorted(DEFAULT_PATTERNS)}")
    merged = {**DEFAULT_PATTERNS, **(patterns or {})}
    return {k: re.compile(v) for k, v in merged.items()}


def classify_name(name: str, pats: Mapping[str, re.Pattern]) -> str:
    """Class of one GPU event (kernel / gpu_memcpy / gpu_memset) from its name."""
    if pats["amax_comm"].search(name):
        return AMAX_COMM
    if pats["comm"].search(name):
        return COMM
    if pats["memset"].search(name):
        return MEMSET
    if pats["memcpy"].search(name):
        return MEMCPY
    if pats["quant"].search(name):
        return QUANT
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
