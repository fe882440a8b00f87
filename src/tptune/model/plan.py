"""Analytic plan: sharded GEMM shapes, FLOPs, collective bytes and roofline time estimates.

Estimates (seed 003's cost model): a GEMM takes 2·m·k·n / (peak · efficiency); a ring all-gather or
reduce-scatter over ``tp`` ranks moves (tp-1)/tp of the full buffer through each rank's link, so it
takes bytes·(tp-1)/tp / bus_bandwidth + latency. Perfect overlap hides the shorter of the two.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from tptune.model.spec import ModelConfig
from tptune.model.ops import OPS, op_gemms


@dataclass(frozen=True)
class Hardware:
    peak_tflops: float = 989.0        # dense bf16 of an H100/H200 SXM
    gemm_efficiency: float = 0.75     # achieved fraction of peak on large GEMMs
    bus_gbps: float = 200.0           # NCCL bus bandwidth of one collective, GB/s
    latency_us: float = 10.0          # fixed cost of one collective
    peak_tflops_fp8: float = 1979.0   # dense FP8 of an H100/H200 SXM (FP8 workloads)

    # hardware keys other stages read (the memory floor, FP8's recipe check), not the plan
    OTHER_KEYS = ("gpu_memory_gb", "gpu")

    @classmethod
    def from_dict(cls, d: dict | None) -> "Hardware":
        d = {k: v for k, v in dict(d or {}).items() if k not in cls.OTHER_KEYS}
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"hardware: unknown field(s) {sorted(unknown)}")
        return cls(**{k: float(v) for k, v in d.items()})


def gemm_ms(flops: int, hw: Hardware) -> float:
    return flops / (hw.peak_tflops * 1e12 * hw.gemm_efficiency) * 1e3


def collective_ms(buffer_bytes: int, tp: int, hw: Hardware) -> float:
    if buffer_bytes == 0 or tp == 1:
        return 0.0
    return buffer_bytes * (tp - 1) / tp / (hw.bus_gbps * 1e9) * 1e3 + hw.latency_us / 1e3


def build_plan(mc: ModelConfig, tp_sizes: list[int], hw: Hardware, ops=OPS) -> pl.DataFrame:
    rows = []
    w = mc.workload
    if w.is_fp8 and not w.fp8_emulation:  # FP8 GEMMs at FP8 peak; all-gathers move FP8 bytes
        hw = replace(hw, peak_tflops=hw.peak_tflops_fp8)
    for op in ops:
        for tp in tp_sizes:
            if mc.tp_problems(tp):
                continue
            for g in op_gemms(op, tp, mc):
                buf = g.comm_elems * w.comm_bytes(g.collective)
                t_gemm = gemm_ms(g.flops, hw)
                t_comm = collective_ms(buf, tp, hw)
                rows.append({
                    "op": op, "tp": tp, "gemm": g.gemm, "m": g.m, "k": g.k, "n": g.n,
                    "gflops": g.flops / 1e9,
                    "collective": g.collective,
                    "comm_buffer_mib": buf / 2**20,
                    "comm_traffic_mib": buf * (tp - 1) / tp / 2**20,
                    "est_gemm_ms": t_gemm,
                    "est_comm_ms": t_comm,
                    "est_serial_ms": t_gemm + t_comm,
                    "est_overlapped_ms": max(t_gemm, t_comm),
                    "comm_to_gemm": t_comm / t_gemm if t_gemm else float("inf"),
                })
    return pl.DataFrame(rows)


def plan_summary(plan: pl.DataFrame) -> pl.DataFrame:
    """Per op and TP: totals of fwd+bwd, serial vs perfectly overlapped estimate."""
    return (plan.group_by("op", "tp", maintain_order=True)
            .agg(pl.col("gflops").sum(), pl.col("comm_traffic_mib").sum(),
                 pl.col("est_gemm_ms").sum(), pl.col("est_comm_ms").sum(),
                 pl.col("est_serial_ms").sum(), pl.col("est_overlapped_ms").sum()))


# The CPU default (config/models/tiny.yaml at seq 512, mbs 1): the GEMM FLOPs of one fwd+bwd iteration of its
# four ops, summed over the ranks (the same at every TP), in GFLOP. It runs in 1 to 2 minutes on 2 cores
# (README); tests/model/test_model_name.py holds this to the file.
CPU_DEFAULT_GFLOP = 9.663676416


def iteration_gflop(mc: ModelConfig, tp: int, ops=OPS) -> float:
    """The GEMM GFLOP of one fwd+bwd iteration of ``ops`` at ``tp``, summed over the ranks."""
    return sum(g.flops for op in ops for g in op_gemms(op, tp, mc)) * tp / 1e9


def cpu_size_ratio(mc: ModelConfig, tp: int, ops=OPS) -> float:
    """How many times the CPU default's GEMM work one iteration of this model's ops is (iteration_gflop): what
    a CPU run's rounds take longer by, roughly."""
    return iteration_gflop(mc, tp, ops) / CPU_DEFAULT_GFLOP
