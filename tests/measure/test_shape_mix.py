"""An op that runs at several shapes under one communicator config (tiny-moe's fc1: the dense layer's
MLP and the shared experts) is measured at each shape in every round, and its round value is the mix
weighted by each shape's share of the op's runs per step (real gloo, 2 ranks, torch backend)."""
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml

from conftest import ROOT
from tptune.cases import make_case
from tptune.measure.launch import _round_point
from tptune.model.spec import parse_model
from tptune.model.ops import op_mix
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.torch_backend import TorchOpBench

TP = 2
SETTINGS = {"backend": "torch", "timing": {"warmup": 1, "iters": 4, "mode": "gpu"}}


def _moe():
    return parse_model(yaml.safe_load((ROOT / "config/models/tiny-moe.yaml").read_text()), "tiny-moe")


def _dense():
    return parse_model({"hidden_size": 64, "ffn_hidden_size": 96, "num_attention_heads": 4, "num_query_groups": 2,
                        "kv_channels": 16, "swiglu": True,
                        "workload": {"seq_length": 32, "micro_batch_size": 2, "dtype": "fp32"}}, "dense")


def _worker(rank, init_file, out_dir, results):
    from tptune.measure.worker.harness import run_case
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    ctx = RankContext(rank, TP, rank, torch.device("cpu"), dist.group.WORLD, dist.group.WORLD)
    out = {}
    for name, mc in (("moe", _moe()), ("dense", _dense())):
        for op in ("fc1", "fc2", "qkv"):
            case = make_case(op, TP, "chunked.n2")
            out[(name, op)] = run_case(case, mc, ctx, dict(SETTINGS), Path(out_dir) / name / op)
    results[rank] = out
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    init_file = tempfile.mktemp()
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_worker, args=(init_file, str(tmp_path_factory.mktemp("cases")), results), nprocs=TP, join=True)
        res = dict(results)
    return {key: {"reply": {"ranks": [res[r][key] for r in range(TP)]}} for key in res[0]}


def test_bench_built_at_the_given_shape():
    mc = _moe()
    ctx = RankContext(0, 1, 0, torch.device("cpu"), None, None)
    b = TorchOpBench(make_case("fc1", 1, "nocomm"), mc, ctx, shape=(256, 1536))
    assert tuple(b.weight.shape) == (1536, 256)
    assert tuple(TorchOpBench(make_case("fc1", 1, "nocomm"), mc, ctx).weight.shape) == (512, 256)  # primary


@pytest.mark.parametrize("op", ["fc1", "fc2"])
def test_each_shape_measured_and_mixed_by_share(replies, op):
    mix = op_mix(op, _moe())
    assert [s.what for s, _ in mix] == ["dense MLP", "shared expert"] and [w for _, w in mix] == [0.25, 0.75]
    for res in replies[("moe", op)]["reply"]["ranks"]:
        shapes = res["shapes"]
        assert [(s["k_in"], s["n_out"], s["layers"], s["share"]) for s in shapes] == \
            [(s.k_in, s.n_out, s.layers, w) for s, w in mix]
        for k in ("fwd_ms", "bwd_ms", "total_ms"):
            n = len(res["samples"][k])
            assert n == SETTINGS["timing"]["iters"]
            want = [sum(s["share"] * s["samples"][k][i] for s in shapes) for i in range(n)]
            assert res["samples"][k] == pytest.approx(want)
            # the mix lies between its shapes, strictly unless they time alike
            assert all(min(s["samples"][k][i] for s in shapes) <= res["samples"][k][i]
                       <= max(s["samples"][k][i] for s in shapes) + 1e-12 for i in range(n))


def test_single_shape_ops_unchanged(replies):
    for key in (("moe", "qkv"), ("dense", "fc1"), ("dense", "fc2")):
        for res in replies[key]["reply"]["ranks"]:
            assert "shapes" not in res and len(res["samples"]["total_ms"]) == SETTINGS["timing"]["iters"]
        assert "shapes" not in _round_point("c", "s", [(0, replies[key])])


def test_round_point_per_shape_rounds(replies):
    rounds = [(0, replies[("moe", "fc1")]), (1, replies[("moe", "fc2")])]   # two rounds of like layout
    p = _round_point("fc1-tp2-chunked.n2", "s", rounds)
    assert [s["what"] for s in p["shapes"]] == ["dense MLP", "shared expert"]
    for s in p["shapes"]:
        assert s["round_ids"] == [0, 1] and len(s["total_ms"]) == 2
    # each shape's round value: the median over iterations of the slowest rank, as the mix's is
    import statistics
    for i, (_, rep) in enumerate(rounds):
        ranks = rep["reply"]["ranks"]
        for j, s in enumerate(p["shapes"]):
            slow = [max(r["shapes"][j]["samples"]["total_ms"][t] for r in ranks) for t in range(SETTINGS["timing"]["iters"])]
            assert s["total_ms"][i] == pytest.approx(statistics.median(slow), rel=1e-5)
        mix = [max(r["samples"]["total_ms"][t] for r in ranks) for t in range(SETTINGS["timing"]["iters"])]
        assert p["timing"]["total_ms"]["rounds"][i] == pytest.approx(statistics.median(mix), rel=1e-5)
