"""The four TP linear ops of a GPT layer and the sharded GEMMs/collectives of each at a TP size.

Column-parallel (qkv, fc1): all-gather of the sequence-parallel input before fprop; in backward the
input is all-gathered again for wgrad (overlapped with dgrad: TE's *_dgrad bulk) and dgrad's output is
reduce-scattered (overlapped with wgrad: TE's *_wgrad bulk).
Row-parallel (proj, fc2): reduce-scatter after fprop; in backward the output gradient is all-gathered
before dgrad; wgrad has no collective of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from .model import ModelConfig

OPS = ("qkv", "proj", "fc1", "fc2")
LAYER = "layer"          # a whole transformer block (the layer stage): its cases are "layer-tp<N>-<variant>"
COLUMN_OPS = ("qkv", "fc1")
ROW_OPS = ("proj", "fc2")
# GEMMs TE can overlap, per op (TE names them "<op>_<gemm>").
OP_GEMMS = {
    "qkv": ("fprop", "dgrad", "wgrad"),
    "proj": ("fprop", "dgrad"),
    "fc1": ("fprop", "dgrad", "wgrad"),
    "fc2": ("fprop", "dgrad"),
}
TE_GEMMS = tuple(f"{op}_{g}" for op in ("qkv", "proj", "fc1", "fc2") for g in OP_GEMMS[op])


def parallel_kind(op: str) -> str:
    if op in COLUMN_OPS:
        return "column"
    if op in ROW_OPS:
        return "row"
    raise ValueError(f"unknown op {op!r}: expected one of {', '.join(OPS)}")


def weight_shape(op: str, mc: ModelConfig) -> tuple[int, int]:
    """Full (unsharded) weight as [in_features, out_features] (seed 000 TASK 0)."""
    m = mc.model
    return {
        "qkv": (m.hidden_size, m.qkv_out),
        "proj": (m.q_size, m.hidden_size),
        "fc1": (m.hidden_size, m.fc1_out),
        "fc2": (m.ffn_hidden_size, m.hidden_size),
    }[op]


@dataclass(frozen=True)
class Gemm:
    """One sharded GEMM on one rank: [m, k] x [k, n], and the collective TE overlaps with it."""
    op: str
    tp: int
    gemm: str            # fprop | dgrad | wgrad
    m: int
    k: int
    n: int
    collective: str      # all_gather | reduce_scatter | none
    comm_elems: int      # elements of the full (gathered) buffer the collective moves

    @property
    def flops(self) -> int:
        return 2 * self.m * self.k * self.n

    @property
    def shape_key(self) -> str:
        """Seed 004's key for a per-shape chunk count: "[m, k, n]"."""
        return f"[{self.m}, {self.k}, {self.n}]"


def op_gemms(op: str, tp: int, mc: ModelConfig) -> list[Gemm]:
    """fprop/dgrad/wgrad of ``op`` on one rank at TP size ``tp`` (with sequence parallelism)."""
    t = mc.workload.tokens
    k_in, n_out = weight_shape(op, mc)
    h = mc.model.hidden_size
    if parallel_kind(op) == "column":
        n = n_out // tp
        return [
            Gemm(op, tp, "fprop", t, k_in, n, "all_gather", t * k_in),
            Gemm(op, tp, "dgrad", t, n, k_in, "all_gather", t * k_in),
            Gemm(op, tp, "wgrad", n, t, k_in, "reduce_scatter", t * k_in),
        ]
    k = k_in // tp
    return [
        Gemm(op, tp, "fprop", t, k, n_out, "reduce_scatter", t * h),
        Gemm(op, tp, "dgrad", t, n_out, k, "all_gather", t * h),
        Gemm(op, tp, "wgrad", k, t, n_out, "none", 0),
    ]
