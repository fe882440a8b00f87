"""Engine metrics against intervals picked and combined by hand from the real traces."""

from pathlib import Path

import polars as pl
import pytest

from tptune.trace import load_trace, summarize, trace_metrics
from tptune.trace.metrics import COLUMNS, _drop_truncated_last, attributed_events

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
US = 1e-3  # 1 µs in ms


def _row(df: pl.DataFrame, step: int, phase: str) -> dict:
    rows = df.filter((pl.col("step") == step) & (pl.col("phase") == phase)).to_dicts()
    assert len(rows) == 1
    return rows[0]


def _kernels(trace: str, step: int, phase: str) -> list[tuple]:
    ev = attributed_events(load_trace(TRACES / trace)).filter((pl.col("step") == step) & (pl.col("phase") == phase))
    return sorted(ev.select("correlation", "ts", "dur", "cls").iter_rows())


def test_hand_check_te_userbuffers_qkv_forward_step2():
    # te_qkv_ub, ProfilerStep#2, forward (_Linear launched on the main thread).
    # Kernels (correlation, ts ns, dur ns, class), copied from the trace:
    hand = [
        (5579, 4455598472771346, 37792, "memcpy"),   # Memcpy DtoD, stream 7
        (5605, 4455598472813491, 960, "memset"),     # stream 147
        (5606, 4455598472816146, 435330, "gemm"),    # nvjet ..._TNT, stream 147  -> G1
        (5607, 4455598472818291, 172992, "comm"),    # Memcpy PtoP, stream 149     -> C1
        (5608, 4455598473138804, 5215, "comm"),      # kuserbuffers_pushsend, 149  -> C2
        (5610, 4455598473138964, 2272, "comm"),      # kuserbuffers_pushrecv, 151  -> C3
        (5623, 4455598473145524, 863, "memset"),     # stream 148
        (5624, 4455598473148244, 539873, "gemm"),    # nvjet ..._TNT, stream 148  -> G2
    ]
    assert _kernels("te_qkv_ub.rank0.pt.trace.json.gz", 2, "forward") == hand
    g1 = (4455598472816146, 4455598472816146 + 435330)  # ends ...3251476
    g2 = (4455598473148244, 4455598473148244 + 539873)  # starts before g1 ends -> one merged span
    gemm_union = g2[1] - g1[0]  # 871971
    c1 = (4455598472818291, 4455598472818291 + 172992)
    c2 = (4455598473138804, 4455598473138804 + 5215)  # c3 lies inside c2
    comm_union = (c1[1] - c1[0]) + (c2[1] - c2[0])  # 178207
    overlap = comm_union  # c1 and c2 lie inside g1
    wall = g2[1] - 4455598472771346  # first kernel (the DtoD memcpy) start to last end
    row = _row(trace_metrics([TRACES / "te_qkv_ub.rank0.pt.trace.json.gz"]), 2, "forward")
    assert row["gemm_ms"] == pytest.approx(gemm_union * 1e-6, abs=US)
    assert row["comm_ms"] == pytest.approx(comm_union * 1e-6, abs=US)
    assert row["overlap_ms"] == pytest.approx(overlap * 1e-6, abs=US)
    assert row["exposed_comm_ms"] == pytest.approx(0.0, abs=US)
    assert row["other_ms"] == 0.0
    assert row["wall_ms"] == pytest.approx(wall * 1e-6, abs=US)
    assert (row["gemm_streams"], row["comm_streams"]) == ("147,148", "149,151")


def test_hand_check_nccl_baseline_qkv_backward_step2():
    # te_qkv_base, ProfilerStep#2, backward (_LinearBackward on the autograd thread).
    hand = [
        (409, 4455598352206106, 314400, "comm"),   # ncclDevKernel_AllGather, stream 17   -> A
        (447, 4455598352206522, 800, "memset"),
        (448, 4455598352209146, 845279, "gemm"),   # nvjet ..._NNT (dgrad), stream 7     -> G1
        (483, 4455598353057369, 332448, "comm"),   # ncclDevKernel_ReduceScatter, 17     -> R
        (534, 4455598353057946, 832, "memset"),
        (535, 4455598353060570, 850976, "gemm"),   # nvjet ..._NTT (wgrad), stream 7     -> G2
        (558, 4455598353914680, 55520, "other"),   # elementwise add (AccumulateGrad)
        (569, 4455598353971673, 48416, "other"),
    ]
    assert _kernels("te_qkv_base.rank0.pt.trace.json.gz", 2, "backward") == hand
    a = (4455598352206106, 4455598352520506)
    g1 = (4455598352209146, 4455598353054425)
    r = (4455598353057369, 4455598353389817)
    g2 = (4455598353060570, 4455598353911546)
    # g1 ends before r starts, so r overlaps only g2; a overlaps only g1.
    overlap = (a[1] - g1[0]) + (r[1] - g2[0])  # 311360 + 329247
    row = _row(trace_metrics([TRACES / "te_qkv_base.rank0.pt.trace.json.gz"]), 2, "backward")
    assert row["gemm_ms"] == pytest.approx((845279 + 850976) * 1e-6, abs=US)
    assert row["comm_ms"] == pytest.approx((314400 + 332448) * 1e-6, abs=US)
    assert row["overlap_ms"] == pytest.approx(overlap * 1e-6, abs=US)
    assert row["exposed_comm_ms"] == pytest.approx((314400 + 332448 - overlap) * 1e-6, abs=US)
    assert row["other_ms"] == pytest.approx((55520 + 48416) * 1e-6, abs=US)
    assert row["wall_ms"] == pytest.approx((4455598353971673 + 48416 - a[0]) * 1e-6, abs=US)
    # dgrad (NN layout) and wgrad (NT) told apart by the cuBLAS layout in the name.
    assert row["grad_split"] == "layout"
    assert row["dgrad_ms"] == pytest.approx(845279 * 1e-6, abs=US)
    assert row["wgrad_ms"] == pytest.approx(850976 * 1e-6, abs=US)


def test_all_real_traces_give_both_steps_and_sane_numbers():
    paths = sorted(TRACES.glob("*.json.gz"))
    df = trace_metrics(paths)
    assert df.columns[: len(COLUMNS)] == COLUMNS
    assert set(df["step"]) == {2, 3}
    for r in df.iter_rows(named=True):
        assert r["overlap_ms"] <= min(r["gemm_ms"], r["comm_ms"]) + 1e-9
        assert r["gemm_ms"] + r["comm_ms"] - r["overlap_ms"] <= r["wall_ms"] + 1e-9
        assert r["comm_ms"] > 0 and r["gemm_ms"] > 0
    # async-TP fc1 has forward only; the TE traces forward and backward.
    assert df.filter(pl.col("phase") == "backward").height == 6


def test_backward_launched_on_autograd_thread_gets_step_from_main_thread_window():
    ev = attributed_events(load_trace(TRACES / "te_proj_ub.rank0.pt.trace.json.gz"))
    bwd = ev.filter(pl.col("phase") == "backward")
    assert set(bwd["ptid"]) == {1185}  # the autograd thread, no ProfilerStep of its own
    assert set(bwd["step"]) == {2, 3}


def test_summarize_max_mean_over_ranks_median_over_steps():
    one = trace_metrics([TRACES / "te_qkv_ub.rank0.pt.trace.json.gz"])
    # A second "rank": same trace, GEMM time doubled on it.
    two = pl.concat([one, one.with_columns(rank=pl.lit(1, dtype=pl.Int64), gemm_ms=pl.col("gemm_ms") * 2)])
    s = summarize(two)
    fwd = s.filter(pl.col("phase") == "forward").to_dicts()[0]
    steps = one.filter(pl.col("phase") == "forward")["gemm_ms"]
    assert fwd["n_ranks"] == 2 and fwd["n_steps"] == 2
    assert fwd["gemm_ms_max"] == pytest.approx((steps * 2).median())
    assert fwd["gemm_ms_mean"] == pytest.approx((steps * 1.5).median())


def test_truncated_last_step_is_dropped_only_when_it_looks_truncated():
    df = trace_metrics([TRACES / "te_qkv_ub.rank0.pt.trace.json.gz"])
    assert _drop_truncated_last(df).equals(df)  # complete last step kept
    no_bwd = df.filter(~((pl.col("step") == 3) & (pl.col("phase") == "backward")))
    assert set(_drop_truncated_last(no_bwd)["step"]) == {2}
    fewer = df.with_columns(
        n_kernels=pl.when(pl.col("step") == 3).then(pl.col("n_kernels") - 1).otherwise(pl.col("n_kernels"))
    )
    assert set(_drop_truncated_last(fewer)["step"]) == {2}
    single = df.filter(pl.col("step") == 3)
    assert _drop_truncated_last(single.filter(pl.col("phase") == "forward")).height == 1
