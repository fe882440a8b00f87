"""The chunked method computes exactly what the unsplit TP layer computes (real gloo, 2 ranks)."""
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tptune.cases import make_case
from tptune.model.spec import parse_model
from tptune.model.ops import OPS, weight_shape
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.torch_backend import TorchOpBench

MC = parse_model({"hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "num_query_groups": 2,
                  "kv_channels": 16, "swiglu": True,
                  "workload": {"seq_length": 32, "micro_batch_size": 2, "dtype": "fp32"}}, "numerics")
TP = 2


def _full_forward(op):
    """Single-process unsplit reference of the whole layer, from the same seeded tensors."""
    k_in, n_out = weight_shape(op, MC)
    gen = torch.Generator().manual_seed(1234)
    w = torch.randn(n_out, k_in, generator=gen) / k_in ** 0.5
    x = torch.randn(MC.workload.tokens, k_in, generator=gen)
    if op in ("qkv", "fc1"):
        x = torch.nn.functional.layer_norm(x, (k_in,), torch.ones(k_in))
    return x @ w.t()


def _worker(rank, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    ctx = RankContext(rank, TP, rank, torch.device("cpu"), dist.group.WORLD, dist.group.WORLD)
    out = {}
    for op in OPS:
        for variant in ("none", "nocomm", "chunked.n2", "chunked.n4"):
            bench = TorchOpBench(make_case(op, TP, variant), MC, ctx)
            y = bench.forward().detach().clone()
            bench.backward()
            out[(op, variant)] = (y, {k: v.clone() for k, v in bench.gradients().items()})
    results[rank] = out
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def per_rank():
    init_file = tempfile.mktemp()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(init_file, results), nprocs=TP, join=True)
        return dict(results)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("chunks", ["chunked.n2", "chunked.n4"])
def test_chunked_equals_unsplit(per_rank, op, chunks):
    for rank in range(TP):
        y_ref, g_ref = per_rank[rank][(op, "none")]
        y, g = per_rank[rank][(op, chunks)]
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
        assert g.keys() == g_ref.keys()
        for name in g_ref:
            torch.testing.assert_close(g[name], g_ref[name], rtol=1e-5, atol=1e-5, msg=f"{op} {chunks} d{name}")


@pytest.mark.parametrize("op", OPS)
def test_tp_layer_matches_single_process_layer(per_rank, op):
    full = _full_forward(op)
    tokens = MC.workload.tokens
    for rank in range(TP):
        y, _ = per_rank[rank][(op, "none")]
        if op in ("qkv", "fc1"):  # column-parallel: this rank's output columns, all tokens
            n = full.shape[1] // TP
            expect = full[:, rank * n:(rank + 1) * n]
        else:  # row-parallel + reduce-scatter: all columns, this rank's tokens
            expect = full[rank * tokens // TP:(rank + 1) * tokens // TP]
        torch.testing.assert_close(y, expect, rtol=1e-4, atol=1e-4)


def test_nocomm_keeps_the_gemm_shapes(per_rank):
    for op in OPS:
        y, g = per_rank[0][(op, "nocomm")]
        y_ref, g_ref = per_rank[0][(op, "none")]
        assert y.shape == y_ref.shape and g["weight"].shape == g_ref["weight"].shape
