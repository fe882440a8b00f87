import pytest

from tptune.model.spec import parse_model
from tptune.model.ops import op_gemms
from tptune.model.plan import Hardware, build_plan, collective_ms, gemm_ms

MC = parse_model({"hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
                  "num_query_groups": 8, "kv_channels": 128, "swiglu": True,
                  "workload": {"seq_length": 8192, "micro_batch_size": 1, "dtype": "bf16"}}, "70b")


def test_sharded_shapes_by_hand():
    # qkv at TP=4: out = 8192 + 2*8*128 = 10240 -> 2560 per rank; tokens 8192 after all-gather.
    fp, dg, wg = op_gemms("qkv", 4, MC)
    assert (fp.m, fp.k, fp.n) == (8192, 8192, 2560) and fp.collective == "all_gather"
    assert (dg.m, dg.k, dg.n) == (8192, 2560, 8192)
    assert (wg.m, wg.k, wg.n) == (2560, 8192, 8192) and wg.collective == "reduce_scatter"
    # fc2 at TP=2: [ffn/2 = 14336 -> 8192], reduce-scatter after fprop.
    fp, dg, wg = op_gemms("fc2", 2, MC)
    assert (fp.m, fp.k, fp.n) == (8192, 14336, 8192) and fp.collective == "reduce_scatter"
    assert (dg.m, dg.k, dg.n) == (8192, 8192, 14336) and dg.collective == "all_gather"
    assert wg.collective == "none"
    # fc1 gated: out = 2*28672 = 57344 -> 14336 per rank at TP=4
    assert op_gemms("fc1", 4, MC)[0].n == 14336


def test_flops_bytes_and_estimates_by_hand():
    hw = Hardware(peak_tflops=1000, gemm_efficiency=0.5, bus_gbps=100, latency_us=0)
    plan = build_plan(MC, [4], hw, ops=["proj"])
    fprop = plan.filter(plan["gemm"] == "fprop").row(0, named=True)
    # proj fprop at TP=4: [8192 x 2048] x [2048 x 8192]: 2*8192*2048*8192 = 274.877906944 GFLOP
    assert fprop["gflops"] == pytest.approx(2 * 8192 * 2048 * 8192 / 1e9)
    # reduce-scatter of [8192, 8192] bf16 = 128 MiB; each rank moves 3/4 of it = 96 MiB
    assert fprop["comm_buffer_mib"] == pytest.approx(128.0)
    assert fprop["comm_traffic_mib"] == pytest.approx(96.0)
    # 274.9 GFLOP at 500 TFLOP/s = 0.5498 ms; 96 MiB at 100 GB/s = 1.0066 ms
    assert fprop["est_gemm_ms"] == pytest.approx(274.877906944e9 / 500e12 * 1e3)
    assert fprop["est_comm_ms"] == pytest.approx(96 * 2**20 / 100e9 * 1e3)
    assert fprop["est_overlapped_ms"] == pytest.approx(max(fprop["est_gemm_ms"], fprop["est_comm_ms"]))
    assert gemm_ms(2 * 10**12, hw) == pytest.approx(4.0)
    assert collective_ms(2**20, 1, hw) == 0.0


def test_plan_skips_tp_sizes_the_model_cannot_use():
    plan = build_plan(MC, [2, 16], Hardware())
    assert set(plan["tp"]) == {2}
    assert plan.height == 4 * 3
