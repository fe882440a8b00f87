"""A real CPU-only trace (torch.profiler, gloo), as the CPU backend of the
worker writes them: ProfilerStep#N, tptune.forward/backward, tptune.comm.* ranges."""

import polars as pl
import pytest

from tptune.trace import load_trace, summarize, trace_metrics
from tptune.trace.metrics import attributed_events


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    out = tmp_path_factory.mktemp("cpu_trace")
    store = dist.FileStore(str(out / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        w = torch.randn(256, 256, requires_grad=True)

        def step():
            x = torch.randn(128, 256, requires_grad=True)
            with record_function("tptune.forward"):
                with record_function("tptune.comm.all_gather"):
                    parts = [torch.empty_like(x)]
                    dist.all_gather(parts, x.detach())
                y = torch.nn.functional.linear(x + parts[0], w)
                loss = (y @ w).sum()
            with record_function("tptune.backward"):
                loss.backward()
                with record_function("tptune.comm.reduce_scatter"):
                    dist.all_reduce(w.grad)

        path = out / "trace.rank0.json.gz"
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=0, warmup=1, active=3),
            on_trace_ready=lambda p: p.export_chrome_trace(str(path)),
        ) as prof:
            for _ in range(4):
                step()
                prof.step()
    finally:
        dist.destroy_process_group()
    return path


def test_cpu_trace_metrics_are_sensible(cpu_trace):
    trace = load_trace(cpu_trace)
    assert trace.cpu_only and trace.rank == 0
    df = trace_metrics([cpu_trace], drop_truncated_last=False)
    assert set(df["phase"]) == {"forward", "backward"}
    assert df["step"].n_unique() == 3
    for r in df.iter_rows(named=True):
        assert r["gemm_ms"] > 0 and r["comm_ms"] > 0
        assert r["gemm_ms"] + r["comm_ms"] - r["overlap_ms"] <= r["wall_ms"] + 1e-6
        assert r["device"] == "cpu"
    # The wall time of a CPU phase is the span of its tptune.<phase> range.
    ranges = trace.cpu.filter(pl.col("name").cast(pl.String) == "tptune.forward")["dur"].sort() * 1e-6
    assert sorted(df.filter(pl.col("phase") == "forward")["wall_ms"]) == pytest.approx(list(ranges)[-3:], abs=1e-6)
    assert summarize(df).height == 2


def test_cpu_gemms_counted_once_and_comm_ranges_are_comm(cpu_trace):
    ev = attributed_events(load_trace(cpu_trace))
    names = dict(ev.group_by(pl.col("name").cast(pl.String)).agg(pl.col("cls").first()).iter_rows())
    # aten::linear > aten::matmul > aten::mm: only the outermost remains.
    assert names.get("aten::linear") == "gemm" and "aten::mm" in names  # mm inside MmBackward0
    fwd_gemms = ev.filter((pl.col("phase") == "forward") & (pl.col("cls") == "gemm"))
    assert set(fwd_gemms["name"].cast(pl.String)) == {"aten::linear", "aten::matmul"}
    assert names.get("tptune.comm.all_gather") == "comm"
    # Backward: each MmBackward0 runs two mm (dgrad first, then wgrad).
    bwd = trace_metrics([cpu_trace], drop_truncated_last=False).filter(pl.col("phase") == "backward")
    assert set(bwd["grad_split"]) == {"order"}
    for r in bwd.iter_rows(named=True):
        assert r["dgrad_ms"] > 0 and r["wgrad_ms"] > 0
        assert r["dgrad_ms"] + r["wgrad_ms"] == pytest.approx(r["gemm_ms"], abs=1e-6)
