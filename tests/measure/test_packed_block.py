"""The layer stage on packed THD input (issue 53), on the torch backend: attention runs per sequence (a
sequence's output is that sequence run alone, whatever the others hold), and a packed session measured by
a real worker group over gloo records fwd+bwd and forward-only samples, its padding and its numerics."""
from __future__ import annotations

import pytest
import torch

from tptune.cases import PackError, make_case
from tptune.measure.launch import Launcher, read_run_json
from tptune.measure.preflight import resolve_here
from tptune.measure.session_spec import SessionSpec
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.torch_block import TorchBlockBench
from tptune.model.spec import load_model

from conftest import ROOT, base_config

TINY = ROOT / "config" / "models" / "tiny.yaml"
T, LENGTHS = 64, [20, 30]          # sequences [0, 20) and [20, 50), then 14 tokens of padding
SEQ2 = slice(20, 50)


def _outputs(case, inputs, bins) -> list[torch.Tensor]:
    """The block's output on each input, in process at TP 1: nocomm there is the block itself (its
    collectives over one rank are copies), so no process group is needed."""
    mc = load_model(TINY, {"seq_length": T})   # fp32
    ctx = RankContext(0, 1, 0, torch.device("cpu"), None, None)
    bench = TorchBlockBench(case, mc, ctx, {"layer": {"num_layers": 2, "bins": bins}})
    outs = []
    for x in inputs:
        bench.x = x.clone().requires_grad_(True)
        outs.append(bench.forward().detach())
    bench.close()
    return outs


def test_attention_runs_per_sequence():
    torch.manual_seed(0)
    x = torch.randn(T, 512)
    changed = x.clone()
    changed[:20] = torch.randn(20, 512)   # sequence 1's tokens
    bins = {"0": LENGTHS, "1": [30]}
    base, after = _outputs(make_case("layer", 1, "nocomm", "pack64.b0"), [x, changed], bins)
    # sequence 2 and the padding segment compute exactly what they did; sequence 1 does not
    assert torch.equal(base[20:], after[20:])
    assert not torch.allclose(base[:20], after[:20])
    # sequence 2's output is sequence 2 run alone (bin 1: one sequence of its 30 tokens), same weights
    alone, = _outputs(make_case("layer", 1, "nocomm", "pack30.b1"), [x[SEQ2]], bins)
    assert torch.allclose(base[SEQ2], alone, atol=1e-5, rtol=1e-5)
    # one causal sequence of T tokens (the unpacked layer stage) lets sequence 2 attend to sequence 1
    one, one_after = _outputs(make_case("layer", 1, "nocomm"), [x, changed], bins)
    assert not torch.allclose(one[SEQ2], one_after[SEQ2])
    assert torch.allclose(one[:20], base[:20], atol=1e-5, rtol=1e-5)   # the first sequence starts both ways


def test_a_bin_that_cannot_fill_its_t_is_refused():
    with pytest.raises(ValueError, match="holds 70 tokens, more than T = 64"):
        _outputs(make_case("layer", 1, "none", "pack64.b0"), [], {"0": [40, 30]})
    with pytest.raises(ValueError, match="no bin 2"):
        _outputs(make_case("layer", 1, "none", "pack64.b2"), [], {"0": LENGTHS})
    with pytest.raises(PackError, match="positive integers"):
        make_case("layer", 2, "none", "pack64.b0").pack.segments([20, 0])


@pytest.mark.slow
def test_packed_session_records_forward_only_and_padding(pool_dir, tmp_path):
    s = resolve_here(base_config(pool_dir))
    op = dict(s.op(s.ops[0]).as_dict(), check=True,
              layer={"num_layers": 2, "bins": {"0": LENGTHS, "7": [64]}})
    members = [make_case("layer", 2, v, "pack64.b0") for v in ("none", "chunked.n2")]
    with pytest.raises(ValueError, match="needs bin 3"):
        SessionSpec("packed", [make_case("layer", 2, "none", "pack64.b3")], s.model, op)
    rec = Launcher(s).session(SessionSpec("packed", members, s.model, op), tmp_path / "sess")
    assert sorted(rec["runs"]) == sorted(c.id for c in members)
    for c in members:
        run = read_run_json(tmp_path / "sess" / c.dir_name)
        assert run["status"] == "ok", run["error"]
        assert run["case"] == c.id == f"layer-tp2-pack64.b0-{c.variant_id}"
        t = run["timing"]
        assert t["total_ms"]["n"] == t["fwd_only_ms"]["n"] == 6 and t["fwd_only_ms"]["round_iters"] == [3, 3]
        assert 0 < t["fwd_only_ms"]["median"] and len(t["fwd_only_ms"]["rounds"]) == 2
        assert run["pack"] == {"bin": 0, "tokens": 64, "real_tokens": 50, "padding": 14, "sequences": 2,
                               "max_seqlen": 30, "lengths": LENGTHS}
        assert run["settings"]["layer"]["bins"] == {"0": LENGTHS}   # its own bin only
        assert run["correctness"]["ok"] is True


def test_fill_bins_are_sample_bin_bins_reproducibly():
    """A session's layer.bins from the user's lengths (packing.rules.sample_bin), one generator per bin id."""
    from tptune.measure.session_spec import fill_bins

    lengths = [3000, 1800, 900, 700, 400, 250, 120] * 20
    bins = fill_bins(lengths, 4096, ids=(0, 5), seed=3)
    assert bins == fill_bins(lengths, 4096, ids=(0, 5), seed=3) and set(bins) == {"0", "5"}
    for k, b in bins.items():
        assert b and sum(b) <= 4096 and all(type(x) is int and x in lengths for x in b)
        make_case("layer", 2, "none", f"pack4096.b{k}").pack.segments(b)   # fits its T
