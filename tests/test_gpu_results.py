"""What the H200 runs recorded, checked on CPU: TP=4 traces, the committed results, and the decisions
re-derived from the recorded points with this checkout's decision code."""
import json

import pytest
import yaml

from tptune.ops import TE_GEMMS
from tptune.search.ubcfg import validate_ub_cfgs
from tptune.trace import load_trace, summarize, trace_metrics
from tptune.trace.classify import classify

from conftest import FIXTURES, ROOT

TP4 = FIXTURES / "gpu" / "tp4"
RESULTS = ROOT / "results"
RUNS = ["h200x4-llama3-70b", "h200x4-llama3-70b-grid", "h200x4-llama3-70b-joint-qkv", "h200x2-llama3-70b"]


def _phase(summary, phase, col):
    return summary.filter(summary["phase"] == phase)[f"{col}_max"][0]


@pytest.mark.parametrize("op", ["qkv", "fc1"])
def test_tp4_forward_comm_exposed_with_nccl_hidden_with_userbuffers(op):
    base = summarize(trace_metrics([TP4 / f"{op}-tp4-none.rank0.trace.json.gz"]))
    for v in ("ub.te", "ub.nemo_tp4"):
        ub = summarize(trace_metrics([TP4 / f"{op}-tp4-{v}.rank0.trace.json.gz"]))
        assert _phase(base, "forward", "overlap_ms") == 0.0  # NCCL all-gather, then the GEMM
        assert _phase(base, "forward", "exposed_comm_ms") > 0.3
        assert _phase(ub, "forward", "overlap_ms") > 0.25  # ring-exchange chunks under the GEMM
        assert _phase(ub, "forward", "exposed_comm_ms") < _phase(base, "forward", "exposed_comm_ms")


@pytest.mark.parametrize("name", sorted(p.name for p in TP4.glob("*.trace.json.gz")))
def test_tp4_kernel_classes(name):
    t = load_trace(TP4 / name)
    k = classify(t.gpu)
    comm = set(k.filter(k["cls"] == "comm")["name"].cast(str))
    gemm = set(k.filter(k["cls"] == "gemm")["name"].cast(str))
    assert gemm and all(n.startswith("nvjet_") for n in gemm)
    if "-none." in name:
        assert comm and all(n.startswith("ncclDevKernel_") for n in comm)
    else:
        assert any("userbuffers" in n for n in comm)
        assert not any(n.startswith("ncclDevKernel_") for n in comm)


@pytest.mark.parametrize("run", RUNS)
def test_committed_run_jsons(run):
    runs = [json.loads(p.read_text()) for p in (RESULTS / run / "cases").rglob("run.json")]
    assert len(runs) >= 40
    for r in runs:
        env = r["environment"] if r["status"] == "ok" else None
        if env:
            assert env["gpu_name"] == "NVIDIA H200" and env["sm_count"] == 132
            assert env["env"] == {"UB_SKIPMC": "1", "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                  "NVSHMEM_DISABLE_NVLS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}
            assert r["timing"]["total_ms"]["n"] == 30
            if r["variant"].startswith("ub."):
                assert r["correctness"]["ok"], r["case"]
    failed = [r for r in runs if r["status"] != "ok"]
    if run.endswith("-grid"):  # the deliberately hanging case, and only it
        assert [(r["case"], r["error"]["kind"]) for r in failed] == [("qkv-tp2-ub.te+dgrad.bulk.sm1", "timeout")]
    else:
        assert not failed


@pytest.mark.parametrize("run", RUNS)
def test_emitted_configs_load_as_they_are(run):
    for f in (RESULTS / run).glob("tp_comm_overlap_cfg*.yaml"):
        cfg = yaml.safe_load(f.read_text())
        assert sorted(cfg) == sorted(TE_GEMMS)
        validate_ub_cfgs(cfg)
    assert json.loads((RESULTS / run / "ub_cfgs.json").read_text()) == yaml.safe_load(
        (RESULTS / run / "tp_comm_overlap_cfg.yaml").read_text())


@pytest.mark.parametrize("run,expected_tp", [("h200x4-llama3-70b", 4), ("h200x4-llama3-70b-grid", 4),
                                          ("h200x2-llama3-70b", 1)])
def test_decisions_rederived_from_recorded_points(run, expected_tp, tmp_path):
    """The TP decision of every op and of the model, replayed from the committed point.json files."""
    from tptune.decide import model_tp, tp_step
    from tptune.settings import resolve

    cfg = json.loads((RESULTS / run / "config.json").read_text())
    cfg.pop("_source", None)
    s = resolve(cfg, base_dir=ROOT, check_hardware=False)
    decisions = json.loads((RESULTS / run / "decisions.json").read_text())
    points_by_op = {}
    for op in s.ops:
        points = {int(p.parent.name[2:]): json.loads(p.read_text())
                  for p in sorted((RESULTS / run / "search" / op).glob("tp*/point.json"))}
        points_by_op[op] = points
        rec = tp_step(s, op, max(points), points)
        assert rec["next"] is None
        assert rec["chosen_tp"] == decisions["ops"][op]["tp"], op
    assert model_tp(s, points_by_op)[0] == decisions["meta"]["model_tp"] == expected_tp
