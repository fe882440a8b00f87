"""The bound's local collectives (te_common.LocalCollectives) on CPU tensors: what a gather and a
reduce-scatter leave in their outputs, including FP8 bytes, whose formats must never mix."""
import pytest
import torch

from tptune.measure.worker.te_common import LocalCollectives


def test_gather_fills_every_slice_with_the_ranks_own_shard():
    lc = LocalCollectives(rank=1, world=4)
    inp = torch.arange(6, dtype=torch.float32)
    out = torch.full((24,), float("nan"))
    lc.all_gather_into_tensor(out, inp)
    assert torch.equal(out.view(4, 6), inp.expand(4, 6))


def test_gather_in_place_keeps_the_shard():
    lc = LocalCollectives(rank=2, world=4)
    out = torch.zeros(4, 3)
    out[2] = torch.tensor([1.0, 2.0, 3.0])
    lc.all_gather_into_tensor(out.view(-1), out[2])
    assert torch.equal(out, torch.tensor([[1.0, 2.0, 3.0]] * 4))


def test_fp8_bytes_of_one_format_never_reach_another():
    """Two FP8 tensors of one size and dtype (uint8 bytes): E4M3 activations, then E5M2 gradients.
    E4M3's byte 0x7E (448) read as E5M2 is NaN; the gather must hand each tensor its own bytes."""
    lc = LocalCollectives(rank=0, world=2)
    e4m3 = torch.full((8,), 0x7E, dtype=torch.uint8)
    e5m2 = torch.full((8,), 0x3C, dtype=torch.uint8)      # 1.0 in E5M2
    lc.all_gather_into_tensor(torch.empty(16, dtype=torch.uint8), e4m3)
    out = torch.empty(16, dtype=torch.uint8)
    lc.all_gather_into_tensor(out, e5m2)
    assert torch.equal(out, torch.full((16,), 0x3C, dtype=torch.uint8))
    if hasattr(torch, "float8_e5m2"):
        assert torch.isfinite(out.view(torch.float8_e5m2).float()).all()


def test_reduce_scatter_takes_the_ranks_slice_and_checks_sizes():
    lc = LocalCollectives(rank=1, world=2)
    out = torch.empty(3)
    lc.reduce_scatter_tensor(out, torch.arange(6, dtype=torch.float32))
    assert out.tolist() == [3.0, 4.0, 5.0]
    with pytest.raises(RuntimeError, match="nocomm gather"):
        lc.all_gather_into_tensor(torch.empty(5), torch.empty(3))
