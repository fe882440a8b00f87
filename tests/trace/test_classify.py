"""Every distinct GPU event name of the real H200 TP=2 traces lands in the right class."""

from pathlib import Path

import polars as pl
import pytest

from tptune.trace import classify, load_trace
from tptune.trace.classify import classify_cpu_name, merged_patterns

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"

NVJET = "gemm"
EXPECTED = {
    "asynctp_fc1.rank0.pt.trace.json.gz": {
        "Memcpy DtoD (Device -> Device)": "memcpy",
        "Memcpy PtoP (Device -> Device)": "comm",
        "Memset (Device)": "memset",
        "c10d::symmetric_memory::barrier_kernel(unsigned int**, int, int, int, unsigned long)": "comm",
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT": NVJET,
    },
    "te_proj_ub.rank0.pt.trace.json.gz": {
        "Memcpy DtoD (Device -> Device)": "memcpy",
        "Memcpy PtoP (Device -> Device)": "comm",
        "Memset (Device)": "memset",
        "kuserbuffers_pushrecv(int, int, int, int, int*, int*, int, unsigned long, int*, int*)": "comm",
        "kuserbuffers_pushsend(int*, int*, int4*, int4*, int)": "comm",
        "nvjet_sm90_tst_128x192_64x5_4x1_v_bz_coopB_TNN": NVJET,
        "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN": NVJET,
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": NVJET,
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)": "other",
        "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)": "other",
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs_oop<2>(int, int, int, int, int, int, int, int, int, void**, "
        "int, void*, unsigned long)": "comm",
    },
    "te_qkv_base.rank0.pt.trace.json.gz": {
        "Memset (Device)": "memset",
        "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "comm",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "comm",
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT": NVJET,
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NTT": NVJET,
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT": NVJET,
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)": "other",
        "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)": "other",
    },
    "te_qkv_ub.rank0.pt.trace.json.gz": {
        "Memcpy DtoD (Device -> Device)": "memcpy",
        "Memcpy PtoP (Device -> Device)": "comm",
        "Memset (Device)": "memset",
        "kuserbuffers_pushrecv(int, int, int, int, int*, int*, int, unsigned long, int*, int*)": "comm",
        "kuserbuffers_pushsend(int*, int*, int4*, int4*, int)": "comm",
        "nvjet_sm90_tst_256x128_64x4_1x4_h_bz_coopA_NNT": NVJET,
        "nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT": NVJET,
        "nvjet_sm90_tst_320x128_64x3_1x4_h_bz_coopB_NTT": NVJET,
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, "
        "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)": "other",
        "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::BFloat16>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<c10::BFloat16>, std::array<char*, 1ul>)": "other",
        "void userbuffers_fp16_sum_inplace_gpu_rr_rs<2>(int, int, int, int, int, int, int, void**, int, "
        "unsigned long)": "comm",
        "void userbuffers_fp16_sum_inplace_gpu_rw_ag<2>(int, int, int, int, int, int, int, void**, int, "
        "unsigned long)": "comm",
    },
}


@pytest.mark.parametrize("trace_name", sorted(EXPECTED))
def test_every_kernel_of_real_trace_has_expected_class(trace_name):
    gpu = classify(load_trace(TRACES / trace_name).gpu)
    got = dict(gpu.select(pl.col("name").cast(pl.String), "cls").unique().iter_rows())
    assert got == EXPECTED[trace_name]


def test_other_kernel_families():
    pats = merged_patterns()
    cases = {
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": "comm",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 8>(...)": "comm",
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x128_32x3_nn_align8>(Params)": "gemm",
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off": "gemm",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn": "gemm",
        "Memcpy HtoD (Pageable -> Device)": "memcpy",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float>(...)": "other",
    }
    from tptune.trace.classify import classify_name

    assert {n: classify_name(n, pats) for n in cases} == cases


def test_patterns_override_is_merged_over_defaults():
    gpu = load_trace(TRACES / "te_qkv_ub.rank0.pt.trace.json.gz").gpu
    # Treat peer-to-peer copies as plain memcpy: only that changes.
    out = classify(gpu, {"comm": r"userbuffers_|ncclDevKernel_"})
    cls = dict(out.select(pl.col("name").cast(pl.String), "cls").unique().iter_rows())
    assert cls["Memcpy PtoP (Device -> Device)"] == "memcpy"
    assert cls["nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_TNT"] == "gemm"
    with pytest.raises(ValueError, match="unknown pattern keys"):
        classify(gpu, {"gemmm": "x"})


def test_cpu_op_classes():
    pats = merged_patterns()
    got = {
        n: classify_cpu_name(n, pats)
        for n in [
            "aten::mm", "aten::addmm", "aten::matmul", "aten::bmm", "aten::linear", "aten::add",
            "c10d::allgather_", "gloo:all_gather", "record_param_comms", "nccl:_all_gather_base",
            "all_gather_into_tensor", "reduce_scatter_tensor", "tptune.comm.ag_wait", "ProfilerStep#3",
            "tptune.forward",
        ]
    }
    assert got == {
        "aten::mm": "gemm", "aten::addmm": "gemm", "aten::matmul": "gemm", "aten::bmm": "gemm",
        "aten::linear": "gemm", "aten::add": None, "c10d::allgather_": "comm", "gloo:all_gather": "comm",
        "record_param_comms": "comm", "nccl:_all_gather_base": "comm", "all_gather_into_tensor": "comm",
        "reduce_scatter_tensor": "comm", "tptune.comm.ag_wait": "comm", "ProfilerStep#3": None,
        "tptune.forward": None,
    }
