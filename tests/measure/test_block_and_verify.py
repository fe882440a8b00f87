"""The layer stage on CPU: the torch backend's transformer block computes the same thing at TP=2 as at
TP=1, with or without the chunked overlap (real gloo ranks), and tptune verify's checks and CPU run."""
import json
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tptune.cases import CaseIdError, make_case
from tptune.model.spec import parse_model
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.torch_block import TorchBlockBench

from conftest import ROOT

MC = parse_model({"hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "num_query_groups": 2,
                  "kv_channels": 16, "swiglu": True,
                  "workload": {"seq_length": 32, "micro_batch_size": 2, "dtype": "fp32"}}, "layer")


# An MoE model with a dense first layer: the block is [dense, MoE] (router, 4 experts top-2, shared expert)
MC_MOE = parse_model({"hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "num_query_groups": 2,
                      "kv_channels": 16, "swiglu": True, "num_layers": 3, "num_moe_experts": 4, "moe_router_topk": 2,
                      "moe_ffn_hidden_size": 32, "moe_shared_expert_intermediate_size": 48,
                      "moe_layer_freq": [0, 1, 1],
                      "workload": {"seq_length": 32, "micro_batch_size": 2, "dtype": "fp32"}}, "layer-moe")


def _worker(rank, world, init_file, results, mc=MC, variants=("none", "chunked.n2", "nocomm")):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ctx = RankContext(rank, world, rank, torch.device("cpu"), dist.group.WORLD, dist.group.WORLD)
    out = {}
    for variant in variants:
        bench = TorchBlockBench(make_case("layer", world, variant), mc, ctx, {"layer": {"num_layers": 2}})
        out["moe"] = bench.moe
        y = bench.forward().detach().clone()
        bench.backward()
        out[variant] = (y, bench.x.grad.clone(), bench.correctness()["ok"])
    results[rank] = out
    dist.destroy_process_group()


def _run(world, *extra):
    with mp.Manager() as manager:
        results = manager.dict()
        mp.start_processes(_worker, args=(world, tempfile.mktemp(), results, *extra), nprocs=world, join=True,
                           start_method="spawn")
        return dict(results)


@pytest.fixture(scope="module")
def blocks():
    return _run(1), _run(2)


def test_tp2_block_equals_tp1_block(blocks):
    one, two = blocks
    y1, g1, _ = one[0]["none"]
    y2 = torch.cat([two[r]["none"][0] for r in range(2)])   # sequence-parallel halves, in rank order
    g2 = torch.cat([two[r]["none"][1] for r in range(2)])
    assert torch.allclose(y1, y2, atol=1e-4, rtol=1e-4)
    assert torch.allclose(g1, g2, atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def moe_blocks():
    return _run(1, MC_MOE, ("none",)), _run(2, MC_MOE, ("none", "chunked.n2"))


def test_moe_block_tp2_equals_tp1_with_routed_experts(moe_blocks):
    """Top-k routing over each rank's expert shards at TP 2 on gloo computes the TP 1 block."""
    one, two = moe_blocks
    assert one[0]["moe"] == [False, True]
    y1, g1, ok = one[0]["none"]
    assert ok
    y2 = torch.cat([two[r]["none"][0] for r in range(2)])
    g2 = torch.cat([two[r]["none"][1] for r in range(2)])
    assert torch.allclose(y1, y2, atol=1e-4, rtol=1e-4) and torch.allclose(g1, g2, atol=1e-4, rtol=1e-4)
    for r in range(2):   # chunked: the shared expert's fc1/fc2 chunked, the routed part as is
        assert torch.allclose(two[r]["chunked.n2"][0], two[r]["none"][0], atol=1e-5)
    dense = _run(1, MC, ("none",))[0]["none"][0]
    assert not torch.allclose(dense, y1)   # not silently the dense block


def test_chunked_block_computes_the_same_and_bound_differs(blocks):
    _, two = blocks
    for r in range(2):
        y, g, ok = two[r]["chunked.n2"]
        assert ok and torch.allclose(y, two[r]["none"][0], atol=1e-5) and torch.allclose(g, two[r]["none"][1], atol=1e-5)
        assert two[r]["nocomm"][0].shape == y.shape and not torch.allclose(two[r]["nocomm"][0], y)


def test_layer_cases_take_whole_presets_only():
    assert make_case("layer", 2, "ub.tuned_tp2").id == "layer-tp2-ub.tuned_tp2"
    with pytest.raises(CaseIdError, match="whole ub_cfgs preset"):
        make_case("layer", 2, "ub.te+dgrad.bulk.sm8")


def _verify(*args, cfg_text=None, tmp_path=None):
    extra = []
    if cfg_text is not None:
        p = tmp_path / "cfg.yaml"
        p.write_text(cfg_text)
        extra = ["--cfg", str(p)]
    return subprocess.run([sys.executable, "-m", "tptune", "verify", "--model", "config/models/tiny.yaml",
                           *args, *extra], cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("text,needle", [
    ("qkv_frop: {method: ring_exchange}\n", "qkv_frop: unknown GEMM"),
    ("proj_fprop: {method: bulk, num_sm: 8}\n", "proj_fprop: method 'bulk' not supported here"),
    ("fc1_dgrad: {method: bulk, num_sm: 4, aggregate: 1}\n", "bulk does not use 'aggregate'"),
    ("fc2_fprop: {method: pipeline, num_sm: 999}\n", "num_sm=999 out of range"),
    ("- not a mapping\n", "expected a mapping of TE GEMM name"),
])
def test_verify_refuses_bad_files_before_running(tmp_path, text, needle):
    p = _verify("--tp", "2", cfg_text=text, tmp_path=tmp_path)
    assert p.returncode == 2 and needle in p.stderr and "cfg.yaml" in p.stderr


def test_verify_refuses_a_tp_that_does_not_divide_the_model(tmp_path):
    p = _verify("--tp", "16", cfg_text="qkv_fprop: {method: ring_exchange}\n", tmp_path=tmp_path)
    assert p.returncode == 2 and "TP=16: num_attention_heads=8 is not divisible by 16" in p.stderr


@pytest.mark.slow
def test_verify_runs_the_block_on_cpu(tmp_path, pool_dir):
    run = tmp_path / "run.yaml"
    run.write_text(f"launcher: {{pool_dir: {pool_dir}, idle_timeout_s: 5}}\n"
                   "timing: {warmup: 1, iters: 2, min_rounds: 2, max_rounds: 2, profile_steps: 0}\n")
    out = tmp_path / "v.json"
    p = _verify("--tp", "2", "--config", str(run), "--json", str(out),
                cfg_text=(ROOT / "results/stability-llama3-70b-x2/rep1/tp_comm_overlap_cfg.tp2.yaml").read_text(),
                tmp_path=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "torch backend: userbuffers need the te backend" in p.stdout
    res = json.loads(out.read_text())
    rows = {r["setting"]: r for r in res["block"]["rows"]}
    assert set(rows) == {"none", "nocomm", "chunked.n2"} and res["block"]["rounds"] == 2
    assert all(r["status"] == "ok" and r["ms"] > 0 and r["numerics"] for r in rows.values())
    assert rows["chunked.n2"]["vs_none"]["ratio"]["rounds"] == 2
