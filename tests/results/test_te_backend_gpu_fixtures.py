"""What the te backend produced on real GPUs (2x H200, TE 2.20.2, Megatron-core 0.19.2, Llama-3-70B,
seq 8192, mbs 1, bf16, TP=2), through the real launcher: scripts/gpu_smoke_te.py. The run.json files
and three rank-0 traces are committed under tests/fixtures/gpu/ (smoke.log holds the printed table);
these tests pin their structure so CI (no GPU) notices when the launcher/harness/backend contract or
the trace contents drift."""
from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

import pytest

FIX = Path(__file__).parents[1] / "fixtures" / "gpu"
OPS = ("qkv", "proj", "fc1", "fc2")
CASES = [f"{op}-tp2-{v}" for op in OPS for v in ("none", "nocomm", "ub.te")] + ["qkv-tp2-ub.te+dgrad.bulk.sm8.cga2"]
TRACES = {"qkv-tp2-ub.te": "ub", "proj-tp2-ub.te": "ub", "qkv-tp2-none": "none"}
UB_KERNEL = re.compile(r"^(void )?k?userbuffers_")
NCCL_KERNEL = re.compile(r"^ncclDevKernel_|^ncclKernel_")
GEMM_KERNEL = re.compile(r"^nvjet_sm90_")


def _run(case_id: str) -> dict:
    return json.loads((FIX / f"{case_id.replace('+', '_')}.run.json").read_text())


def _kernels(case_id: str) -> list[str]:
    with gzip.open(FIX / f"{case_id}.rank0.trace.json.gz") as f:
        trace = json.load(f)
    return [e["name"] for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy")]


@pytest.mark.parametrize("case_id", CASES)
def test_run_json_is_a_complete_ok_te_measurement(case_id):
    run = _run(case_id)
    assert run["case"] == case_id and run["status"] == "ok" and run["error"] is None
    assert run["backend"] == "te" and run["device"] == "cuda" and run["tp"] == 2
    m = run["model"]
    assert m["model"]["name"] == "llama3-70b" and m["model"]["hidden_size"] == 8192
    assert m["workload"] == {"seq_length": 8192, "micro_batch_size": 1, "dtype": "bf16"}
    assert run["settings"]["timing"] == {"warmup": 5, "iters": 10, "repeats": 3, "profile_steps": 2}
    t = run["timing"]
    for k in ("fwd_ms", "bwd_ms", "total_ms"):
        assert t[k]["n"] == 30 and len(t[k]["samples"]) == 30 and t[k]["median"] > 0
    assert t["total_ms"]["median"] == pytest.approx(statistics.median(t["total_ms"]["samples"]), abs=1e-5)
    assert t["fwd_ms"]["median"] + t["bwd_ms"]["median"] == pytest.approx(t["total_ms"]["median"], rel=0.1)
    assert len(t["per_rank_median_total_ms"]) == 2
    assert run["traces"] == ["trace.rank0.json.gz", "trace.rank1.json.gz"]
    env = run["environment"]
    assert env["transformer_engine"] == "2.20.2" and env["megatron_core"] == "0.19.2"
    assert env["gpu_name"] == "NVIDIA H200"
    # NVLink multicast stayed off in the workers
    assert env["env"] == {"UB_SKIPMC": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                          "NVSHMEM_DISABLE_NVLS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    corr = run["correctness"]
    assert corr["ok"] is True
    if run["variant"].startswith("ub."):
        grads = {"output", "input", "weight"} | ({"norm_weight"} if run["op"] in ("qkv", "fc1") else set())
        assert set(corr["max_abs_err"]) == grads and set(corr["max_rel_err"]) == grads
        assert corr["rtol"] == 0.02 and corr["atol"] == 0.001 and corr["failed"] == []
        assert corr["reference"] == "same layer with tp_comm_overlap=False"
    else:
        assert corr["reference"] is None


def test_the_warm_group_ran_every_case_in_one_process():
    """One worker group served all 13 cases: build/close is re-entrant, UB re-initialised per case."""
    runs = [_run(c) for c in CASES]
    assert sorted(r["launch"]["served_before"] for r in runs) == list(range(len(CASES)))
    first = min(runs, key=lambda r: r["launch"]["served_before"])
    assert first["launch"]["startup"] is not None
    assert all(r["launch"]["startup"] is None for r in runs if r is not first)


@pytest.mark.parametrize("op", OPS)
def test_the_bound_is_below_the_no_overlap_reference(op):
    nocomm, none = (_run(f"{op}-tp2-{v}")["timing"]["total_ms"]["median"] for v in ("nocomm", "none"))
    assert nocomm < none


@pytest.mark.parametrize("case_id,kind", sorted(TRACES.items()))
def test_traces_hold_the_expected_kernels(case_id, kind):
    path = FIX / f"{case_id}.rank0.trace.json.gz"
    assert path.stat().st_size < 1_000_000
    names = _kernels(case_id)
    gemms = [n for n in names if GEMM_KERNEL.search(n)]
    ub = [n for n in names if UB_KERNEL.search(n)]
    nccl = [n for n in names if NCCL_KERNEL.search(n)]
    assert len(gemms) >= 6  # fprop, dgrad, wgrad per profiled step (2 steps)
    if kind == "ub":
        assert ub and not nccl
        assert any("Memcpy PtoP" in n for n in names)  # ring-exchange / bulk copies over NVLink
    else:
        assert nccl and not ub
        assert any("AllGather" in n for n in nccl) and any("ReduceScatter" in n for n in nccl)
    if case_id.startswith("qkv"):
        assert any("rmsnorm_fwd" in n for n in names) and any("rmsnorm_bwd" in n for n in names)


def test_trace_kernels_are_comm_for_the_project_classifier():
    pytest.importorskip("polars")
    from tptune.trace.classify import DEFAULT_PATTERNS

    comm = re.compile(DEFAULT_PATTERNS["comm"])
    for case_id in TRACES:
        names = _kernels(case_id)
        assert any(comm.search(n) for n in names)
        assert not any(comm.search(n) for n in names if GEMM_KERNEL.search(n))
