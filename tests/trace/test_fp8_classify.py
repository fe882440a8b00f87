"""FP8 trace classes: TE's quantization kernels (quant) and the amax all-reduce (amax_comm) are
neither GEMM nor TP communication; on a small synthetic Kineto trace the GEMM, communication and
exposed-communication figures stay those of the GEMMs and the TP collectives alone."""
from __future__ import annotations

import json

import pytest

from tptune.trace import load_trace
from tptune.trace.classify import (AMAX_COMM, COMM, GEMM, OTHER, QUANT, classify_name, fp8_patterns, merged_patterns)
from tptune.trace.metrics import rank_metrics

# Kernel names as Kineto writes them (TE 2.20 kernels, see trace/classify.py; NCCL >= 2.19).
CT = ("void transformer_engine::(anonymous namespace)::cast_transpose_optimized_kernel<8ul, 4ul, float, "
      "__nv_bfloat16, unsigned char>(__nv_bfloat16 const*, unsigned char*, unsigned char*, float const*, "
      "float*, float*, unsigned long, unsigned long)")
DS = ("void transformer_engine::delayed_scaling_recipe::(anonymous namespace)::kernel_bulk(float*, "
      "transformer_engine::delayed_scaling_recipe::(anonymous namespace)::AmaxParams, float const*, float, float)")
AMAX = ("void transformer_engine::(anonymous namespace)::amax_kernel<8, true, __nv_bfloat16>(__nv_bfloat16 "
        "const*, float*, unsigned long, float const*)")
NAMES = {
    CT: QUANT, DS: QUANT, AMAX: QUANT,
    "void transformer_engine::(anonymous namespace)::cast_fp8_1D_kernel<true, float>(...)": QUANT,
    "void transformer_engine::(anonymous namespace)::block_scaled_1d_cast_transpose_kernel<...>(...)": QUANT,
    "void transformer_engine::mxfp8::quantize_mxfp8_kernel<...>(...)": QUANT,
    "void transformer_engine::(anonymous namespace)::compute_scale_from_amax_kernel(float const*, float*)": QUANT,
    "void transformer_engine::(anonymous namespace)::zero_amax_kernel(float*, float const*)": QUANT,
    "void transformer_engine::(anonymous namespace)::transpose_optimized_kernel<...>(...)": QUANT,
    "void transformer_engine::multi_tensor_swizzle_row_scaling_kernel<...>(...)": QUANT,
    "nvjet_sm90_qqtst_128x256_64x4_2x1_v_bz_coopA_TNT": GEMM,                 # FP8 GEMMs stay GEMMs
    "sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize1x1x1": GEMM,
    "void rmsnorm_fwd_tuned_kernel<transformer_engine::normalization::Kernel_traits<...> >(...)": OTHER,
    "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": COMM,   # FP8 all-gather: TP comm
    "void userbuffers_fp8_sum_inplace_gpu_rr_rs<__nv_fp8_e4m3, 2>(int, ...)": COMM,
}
F32_AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@pytest.mark.parametrize("name,cls", NAMES.items())
def test_names(name, cls):
    assert classify_name(name, merged_patterns(fp8_patterns("delayed"))) == cls
    assert classify_name(name, merged_patterns()) == cls


def test_amax_all_reduce_only_under_an_amax_reducing_recipe():
    assert classify_name(F32_AR, merged_patterns(fp8_patterns("delayed"))) == AMAX_COMM
    assert classify_name(F32_AR, merged_patterns(fp8_patterns("current"))) == AMAX_COMM
    assert classify_name("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, ...)",
                         merged_patterns(fp8_patterns("delayed"))) == AMAX_COMM
    assert fp8_patterns("mxfp8") == {} and fp8_patterns(None) == {}
    assert classify_name(F32_AR, merged_patterns()) == COMM            # bf16 runs: unchanged
    bf16_ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    assert classify_name(bf16_ar, merged_patterns(fp8_patterns("delayed"))) == COMM


def _trace(tmp_path):
    """One forward step on one stream: cast (0-10), AG comm (10-30) beside GEMM (20-60), amax all-reduce
    (60-70), scale update (70-75). GEMM 40 us, comm 20 us of which 10 overlapped; quant 15 us, amax 10 us."""
    kernels = [(CT, 0, 10, 7), ("ncclDevKernel_AllGather_RING_LL(x)", 10, 20, 8),
               ("nvjet_sm90_qqtst_128x256_64x4_2x1_v_bz_coopA_TNT", 20, 40, 7), (F32_AR, 60, 10, 8),
               (DS, 70, 5, 7)]
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
          {"ph": "X", "cat": "user_annotation", "name": "tptune.forward", "pid": 1, "tid": 1, "ts": 0, "dur": 90}]
    for i, (name, ts, dur, stream) in enumerate(kernels):
        ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": i + 0.5, "dur": 0.2, "args": {"correlation": 100 + i}})
        ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": 1000 + ts,
                   "dur": dur, "args": {"correlation": 100 + i, "stream": stream, "device": 0}})
    p = tmp_path / "fp8.rank0.pt.trace.json"
    p.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return p


def test_synthetic_fp8_trace_keeps_gemm_and_exposed_comm_exact(tmp_path):
    tr = load_trace(_trace(tmp_path))
    fp8 = rank_metrics(tr, fp8_patterns("delayed"), drop_truncated_last=False).to_dicts()
    assert len(fp8) == 1
    row = fp8[0]
    assert row["gemm_ms"] == pytest.approx(0.040) and row["comm_ms"] == pytest.approx(0.020)
    assert row["overlap_ms"] == pytest.approx(0.010) and row["exposed_comm_ms"] == pytest.approx(0.010)
    assert row["other_ms"] == pytest.approx(0.0)          # casts and the amax all-reduce are their own classes
    # without the FP8 overlay the amax all-reduce would count as exposed TP communication
    plain = rank_metrics(tr, None, drop_truncated_last=False).to_dicts()[0]
    assert plain["comm_ms"] == pytest.approx(0.030) and plain["exposed_comm_ms"] == pytest.approx(0.020)
