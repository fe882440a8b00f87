"""The candidate capacities T: the one token count every packed micro-batch is padded to.

TE allocates each userbuffers communicator for ``[seq_length * micro_batch_size, hidden]`` (Megatron-LM's
``_initialize_tp_communicators``) and splits its rows into TP chunks (``buffer_shape[0] / tp_size`` in
comm_gemm_overlap.cpp), so T must be a multiple of TP. FP8 adds TE's GEMM rule (``assert_dim_for_fp8_exec``,
transformer_engine/pytorch/utils.py @ d0067d0da6cb01811b8072a7d304f0e00344ce2b: an FP8 GEMM operand's
leading dimensions a multiple of 8 and its last a multiple of 16): the sequence-parallel shard of T / TP
tokens is quantized and its transpose (tokens last) feeds the wgrad GEMM, so T / TP must be a multiple of 16:
T a multiple of 16 x TP (``fp8_multiple``). MXFP8 asks more of userbuffers (a shard's rows a multiple of 128,
``fill_userbuffers_buffer_for_all_gather``): ``fp8_multiple(tp, recipe="mxfp8")`` is 128 x TP.

By default (``candidate_capacities``) a few values between the longest sequence and twice the budget
(``max_token_len``): the longest sequence rounded up, the budget and twice the budget, each rounded to a
multiple of ``lcm(128, the multiple)`` (the top one down, so it stays within twice the budget), at most
three, deduplicated. A list (``workload.packing.capacities``) overrides them, each checked: a positive
integer, a multiple of TP (FP8: of the FP8 multiple), no shorter than the longest sequence.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from tptune.errors import ConfigError

FIELD = "workload.packing.capacities"
GRANULE = 128          # the default candidates' rounding: GEMM tiles and slime's TP x 128 padding alike


def fp8_multiple(tp: int, recipe: str | None = None) -> int:
    """The multiple an FP8 capacity needs at this TP (module doc): 16 TP, MXFP8 128 TP."""
    return (128 if recipe == "mxfp8" else 16) * tp


def multiple(tp: int, fp8: bool, recipe: str | None = None) -> int:
    """What every capacity must divide by: TP, or the FP8 multiple."""
    return fp8_multiple(tp, recipe) if fp8 else tp


def candidate_capacities(lengths: np.ndarray | Sequence[int], max_token_len: int, tp: int, fp8: bool,
                         override: list | None = None, recipe: str | None = None) -> list[int]:
    """The capacities T to measure, ascending (module doc). ConfigError naming ``workload.packing.capacities``
    for an override that is not valid, or where no default candidate holds the longest sequence."""
    longest = int(np.max(lengths))
    m = multiple(tp, fp8, recipe)
    if override is not None:
        problems = capacity_problems(override, longest, tp, fp8, recipe)
        if problems:
            raise ConfigError(FIELD, problems)
        return sorted(set(override))
    if not isinstance(max_token_len, int) or max_token_len < 1:
        raise ConfigError("workload.packing.max_token_len", [f"field 'workload.packing.max_token_len' = "
                                                              f"{max_token_len!r}: expected a positive integer"])
    g = math.lcm(GRANULE, m)
    top = (2 * max_token_len) // g * g
    low = -(-longest // g) * g
    if low > 2 * max_token_len:
        raise ConfigError(FIELD, [f"the longest sequence ({longest} tokens) is longer than every candidate capacity: "
                                  f"they reach twice workload.packing.max_token_len = {2 * max_token_len}; raise "
                                  f"max_token_len or list {FIELD}"])
    budget = -(-max_token_len // g) * g
    out = sorted({c for c in (low, budget, top) if low <= c <= max(top, low)})
    return out[:3]


def capacity_problems(caps, longest: int | None, tp: int, fp8: bool, recipe: str | None = None) -> list[str]:
    """Why a ``workload.packing.capacities`` list is not valid at this TP (empty: it is); ``longest``: the
    longest sequence (None: not checked)."""
    if not isinstance(caps, list) or not caps:
        return [f"field '{FIELD}' = {caps!r}: expected a non-empty list of token counts"]
    out = []
    m = multiple(tp, fp8, recipe)
    for i, c in enumerate(caps):
        if isinstance(c, bool) or not isinstance(c, int) or c < 1:
            out.append(f"field '{FIELD}.{i}' = {c!r}: expected a positive integer (tokens)")
        elif c % m:
            why = (f"a multiple of {m} (FP8 at TP {tp}: {m // tp} x TP, "
                   + ("MXFP8 userbuffers take a shard's rows in multiples of 128)" if recipe == "mxfp8" else
                      "TE's FP8 GEMMs take the sequence-parallel shard's tokens in multiples of 16)")
                   if fp8 else f"a multiple of TP {tp} (userbuffers split T into TP chunks)")
            out.append(f"field '{FIELD}.{i}' = {c}: expected {why}; nearest: {max(m, round(c / m) * m)}")
        elif longest is not None and c < longest:
            out.append(f"field '{FIELD}.{i}' = {c}: shorter than the longest sequence ({longest} tokens), which no bin "
                       "of it could hold")
    dup = sorted({c for c in caps if caps.count(c) > 1 and isinstance(c, int)})
    if dup:
        out.append(f"field '{FIELD}': {dup} listed twice")
    return out
