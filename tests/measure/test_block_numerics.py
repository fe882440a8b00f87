"""The numerics rule (issue 33) on the torch backend's block, two real gloo ranks: settings are judged
against the no-overlap block in higher precision, and erring like same-precision no overlap passes.

A planted corruption (one rank's share of the input gradient summed twice, what a bulk communicator run as
a reduce-scatter does on GPUs) must fail, naming the tensors; benign reorderings (the chunked method's
split GEMMs and collectives, in fp32 and in bf16) must pass."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from test_te_backend import spawn_two_ranks
from tptune.stats import numerics as rule

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "config" / "models" / "tiny.yaml"


def _rank(rank: int, world: int, port: int, dtype: str, q) -> None:
    try:
        from tptune.cases import make_case
        from tptune.measure.worker.context import RankContext
        from tptune.measure.worker.torch_block import TorchBlockBench
        from tptune.model.spec import load_model

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        ctx = RankContext(rank, world, rank, torch.device("cpu"), dist.group.WORLD, dist.new_group(backend="gloo"))
        mc = load_model(TINY, {"dtype": dtype, "seq_length": 64})
        settings = {"layer": {"num_layers": 2}}
        out = {}
        for name, variant, fault in (("none", "none", None), ("chunked", "chunked.n2", None),
                                     ("chunked4", "chunked.n4", None), ("nocomm", "nocomm", None),
                                     ("planted", "chunked.n2", "corrupt_dgrad:1"),
                                     ("planted_none", "none", "corrupt_dgrad")):
            bench = TorchBlockBench(make_case("layer", 2, variant), mc, ctx, {**settings, "fault": fault})
            out[name] = bench.correctness()
            bench.close()
        dist.barrier()
        q.put((rank, "ok", out))
        dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001
        import traceback
        q.put((rank, "error", f"{exc!r}\n{traceback.format_exc()}"))


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def verdicts(request):
    got = spawn_two_ranks(_rank, request.param)
    assert got[0] == got[1], "every rank reports the same verdict (errors summed over ranks)"
    return request.param, got[0]


def test_no_overlap_and_benign_reorderings_pass(verdicts):
    dtype, v = verdicts
    for name in ("none", "chunked", "chunked4"):
        res = v[name]
        assert res["ok"] is True, (name, res["failed"], res["worst"])
        assert res["precision"] == dtype and res["reference"] == rule.HIGHER[dtype]
        # every weight gradient of both layers is judged, beside the output and the input gradient
        assert {"output", "input_grad", "layers.0.qkv", "layers.1.fc2"} <= set(res["tensors"])
        assert res["tensors"]["input_grad"]["l2_ratio"] < 1.2
    assert v["none"]["tensors"]["output"]["l2_ratio"] == pytest.approx(1.0) or dtype == "fp32"
    # the measured errors are those of the precision: bf16 errs by ~2^-8, fp32 by ~2^-24 against fp64
    err = v["none"]["tensors"]["output"]["rel_l2"]
    assert (1e-4 < err < 5e-2) if dtype == "bf16" else (0 < err < 1e-5)
    assert v["nocomm"]["reference"] is None and v["nocomm"]["ok"] is True


def test_a_gradient_shard_summed_twice_fails_naming_the_tensors(verdicts):
    _, v = verdicts
    for name in ("planted", "planted_none"):
        res = v[name]
        assert res["ok"] is False
        assert "input_grad" in res["failed"] and "output" not in res["failed"], res["failed"]
        assert res["tensors"]["input_grad"]["l2_ratio"] > 10 * rule.FACTOR_L2
        # the corruption reaches the first layer's weight gradients through the input gradient of layer 1
        assert any(t.startswith("layers.0.") for t in res["failed"])
        assert "input_grad" in rule.describe_failure(res)


def test_judge_takes_the_unit_roundoff_as_floor_and_refuses_mismatched_tensors():
    base = {"output": {"rel_l2": 0.0, "max_abs": 0.0, "ref_absmax": 4.0}}
    same = rule.judge({"output": {"rel_l2": 2.0 ** -8, "max_abs": 4 * 2.0 ** -8, "ref_absmax": 4.0}}, base, "bf16")
    assert same["ok"] is True and same["tensors"]["output"]["l2_ratio"] == 1.0
    worse = rule.judge({"output": {"rel_l2": 2.0 ** -7, "max_abs": 0.0, "ref_absmax": 4.0}}, base, "bf16")
    assert worse["ok"] is False and worse["failed"] == ["output"]
    with pytest.raises(ValueError, match="input_grad"):
        rule.judge({"input_grad": {"rel_l2": 0, "max_abs": 0}}, base, "bf16")
    with pytest.raises(ValueError, match="precision"):
        rule.judge({}, {}, "int8")
