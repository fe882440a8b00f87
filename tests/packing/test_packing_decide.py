"""The decision arithmetic against cases worked by hand (tptune.packing.decide), and the userbuffers' bytes."""
import math

import numpy as np
import pytest

from tptune.packing.decide import CapacityTimes, NativeTimes, Plan, decide, fit_rounds
from tptune.packing.rules import MicroBatch, Step
from tptune.packing.ub_memory import GIB, buffers, ub_bytes
from tptune.stats.rounds import log_ratio_interval

FB = (0.5, 0.0004)       # native fwd+bwd: 0.5 ms + 0.4 us a token
FWD = (0.2, 0.00013)     # native forward-only


def step(rule, micro_batches, capacity=None):
    return Step(rule, tuple(MicroBatch(tuple(ls), p) for ls, p in micro_batches), capacity)


def native_times(scales, counts=(2000, 6000, 10000), rounds=None):
    rounds = rounds or range(len(scales))
    line = lambda c, n: c[0] + c[1] * n                      # noqa: E731
    return NativeTimes(fwdbwd={r: {n: s * line(FB, n) for n in counts} for r, s in zip(rounds, scales)},
                       fwd={r: {n: s * line(FWD, n) for n in counts} for r, s in zip(rounds, scales)})


def bin_times(cap, none_scales, tuned_scales, none=(3.8, 1.2), tuned=(3.5, 1.1)):
    return CapacityTimes(cap, fwdbwd_none={r: s * none[0] for r, s in enumerate(none_scales)},
                         fwdbwd_tuned={r: s * tuned[0] for r, s in enumerate(tuned_scales)},
                         fwd_none={r: s * none[1] for r, s in enumerate(none_scales)},
                         fwd_tuned={r: s * tuned[1] for r, s in enumerate(tuned_scales)})


def expected(c, a, c_scales, a_scales):
    return log_ratio_interval([math.log(c * x / (a * y)) for x, y in zip(c_scales, a_scales)])


def test_overlap_on_worked_by_hand():
    # native (veRL): 4 micro-batches, 30000 tokens a step. Per round s: fwd+bwd 4 x 0.5 + 0.0004 x 30000 = 14 ms,
    # forward-only 4 x 0.2 + 0.00013 x 30000 = 4.7 ms, two forward-only passes: a = 14 + 2 x 4.7 = 23.4 ms
    native = Plan.of([step("verl", [((9000,), 9000), ((8000,), 8000), ((7000,), 7000), ((6000,), 6000)])])
    # fill at T = 8192: 4 bins, 32768 tokens: padding 2768 / 32768 = 8.4%. No overlap b = 4 x (3.8 + 2 x 1.2)
    # = 24.8 ms; tuned c = 4 x (3.5 + 2 x 1.1) = 22.8 ms. c / a = 0.9744: 2.6% faster; b / a = 1.0598; c / b = 0.919
    fill = Plan.of([step("fill", [((8000,), 8192), ((8000,), 8192), ((7000,), 8192), ((7000,), 8192)], 8192)])
    s_native, s_none, s_tuned = [1.0, 1.01, 0.99], [1.0, 1.01, 0.99], [1.0, 1.012, 0.985]
    ub = {8192: ub_bytes(8192, 4096, 2)}
    d = decide(native, {8192: fill}, {8192: bin_times(8192, s_none, s_tuned)}, native_times(s_native), 2, ub)
    r = d.chosen
    assert (d.verdict, d.capacity, d.native_rule) == ("on", 8192, "verl")
    assert r.step_ms["native"] == pytest.approx(23.4) and r.step_ms["fill"] == pytest.approx(24.8)
    assert r.step_ms["overlap"] == pytest.approx(22.8 * np.mean(s_tuned))
    assert r.padding_share == pytest.approx(2768 / 32768)
    want = expected(22.8, 23.4, s_tuned, s_native)
    assert r.vs_native.ratio == pytest.approx(want.ratio) and r.vs_native.hi == pytest.approx(want.hi)
    assert r.vs_native.ratio == pytest.approx(22.8 / 23.4, rel=2e-3) and r.vs_native.hi < 1
    assert r.padding_cost.ratio == pytest.approx(24.8 / 23.4)
    assert d.fit_residual < 1e-9 and d.fit_outside == 0.0
    # 12 buffers of 8192 x 4096 bf16 (TE's defaults: no ring-exchange reduce-scatter): 0.75 GiB
    assert ub[8192] == 12 * 8192 * 4096 * 2 and r.ub_bytes / GIB == pytest.approx(0.75)
    # the per-round ratios 0.9744 x (1, 1.012 / 1.01, 0.985 / 0.99): geometric mean 0.9734, 2.7% faster
    assert d.sentence.startswith("Use T = 8192, fill-to-capacity packing, overlap on: a step 2.7% faster [1.8%, 3.5%]")
    assert "padding 8.4% of the tokens, +0.75 GiB of userbuffers per GPU." in d.sentence
    assert d.to_dict()["capacities"][0]["vs_native"]["rounds"] == 3


def test_overlap_off_when_padding_outweighs_the_gain():
    # few tokens per GPU per step: one 3000-token micro-batch. a = 0.5 + 1.2 + 2 x (0.2 + 0.39) = 2.88 ms; one
    # bin of 8192 (63% padding): b = 3.8 + 2 x 1.2 = 6.2 ms, c = 3.5 + 2 x 1.1 = 5.7 ms. c / a = 1.979: off;
    # padding costs 6.2 / 2.88 - 1 = 115.3%, overlap saves 1 - 5.7 / 6.2 = 8.1%
    native = Plan.of([step("slime", [((3000,), 3000)])])
    fill = Plan.of([step("fill", [((3000,), 8192)], 8192)])
    flat = [1.0, 1.004, 0.997]
    d = decide(native, {8192: fill}, {8192: bin_times(8192, flat, [1.0, 1.002, 0.999])}, native_times(flat), 2)
    r = d.chosen
    assert d.verdict == "off"
    assert r.vs_native.ratio == pytest.approx(5.7 / 2.88, rel=2e-3) and r.vs_native.lo > 1
    assert r.padding_cost.ratio == pytest.approx(6.2 / 2.88)
    assert r.overlap.ratio == pytest.approx(5.7 / 6.2, rel=2e-3)
    assert d.sentence.startswith("Keep overlap off: padding to T = 8192 costs 115.3% [")
    assert "(padding 63.4% of the tokens) and overlap saves 8.1% [" in d.sentence
    assert "slower [" in d.sentence and "than slime's batching without overlap" in d.sentence


def test_undecided_when_the_interval_straddles_one_and_the_best_capacity_is_chosen():
    native = Plan.of([step("verl", [((9000,), 9000), ((8000,), 8000), ((7000,), 7000), ((6000,), 6000)])])
    plans = {8192: Plan.of([step("fill", [((7500,), 8192)] * 4, 8192)]),
             16384: Plan.of([step("fill", [((15000,), 16384)] * 2, 16384)])}
    # c / a per round: 0.98, 1.03, 0.99 at 8192 (straddles); at 16384 the bins take 2 x (7.2 + 2 x 2.25) = 23.4 x
    # 0.955 per round: clearly faster, so 16384 is chosen
    s_native = [1.0, 1.0, 1.0]
    t8 = bin_times(8192, [1.0] * 3, [0.98 * 23.4 / 22.8, 1.03 * 23.4 / 22.8, 0.99 * 23.4 / 22.8])
    only8 = decide(native, plans, {8192: t8}, native_times(s_native), 2)
    assert only8.verdict == "undecided" and only8.chosen.vs_native.lo < 1 < only8.chosen.vs_native.hi
    # the geometric mean of 0.98, 1.03, 0.99: 0.9998
    assert only8.sentence.startswith("Undecided: at T = 8192 fill-to-capacity with overlap takes 1.000 [0.937, 1.067]")
    t16 = bin_times(16384, [1.0] * 3, [0.955, 0.95, 0.96], none=(7.6, 2.4), tuned=(7.2, 2.25))
    both = decide(native, plans, {8192: t8, 16384: t16}, native_times(s_native), 2,
                  ub={8192: 10, 16384: 20})
    assert (both.verdict, both.capacity) == ("on", 16384)
    assert [r.capacity for r in both.results] == [8192, 16384]
    # where 16384's buffers do not fit the memory left, 8192 is the answer
    assert decide(native, plans, {8192: t8, 16384: t16}, native_times(s_native), 2, ub={8192: 10, 16384: 20},
                  memory_headroom=15).capacity == 8192


def test_native_fit_in_other_rounds_is_compared_unpaired_and_its_fit_reported():
    native = Plan.of([step("verl", [((5000,), 5000), ((12000,), 12000)])])
    fill = Plan.of([step("fill", [((8192,), 8192), ((8000,), 8192)], 8192)])
    nt = native_times([1.0, 1.01, 0.99], rounds=[10, 11, 12])
    nt.fwdbwd[10][6000] *= 1.05                       # a fit that misses one point by about 5%
    d = decide(native, {8192: fill}, {8192: bin_times(8192, [1.0] * 3, [1.0, 0.99, 1.01])}, nt, 0)
    assert d.chosen.vs_native.paired is False and d.chosen.overlap.paired is True
    assert 0.02 < d.fit_residual < 0.05
    assert d.fit_outside == 0.5                      # 12000 tokens is beyond the measured 10000
    with pytest.raises(ValueError, match="a degree-2 fit needs 3"):
        fit_rounds({0: {1: 1.0, 2: 2.0}}, degree=2)


def test_userbuffers_bytes_follow_te_initialize_ub():
    T, h = 4096, 1024
    base = buffers(T, h, 4)
    assert len(base) == 12 and set(base.values()) == {T * h * 2}
    # proj_fprop by ring exchange is a reduce-scatter P2P buffer of 2 TP - 1 chunks of T / TP rows
    ring = buffers(T, h, 4, ub_cfgs={"proj_fprop": {"method": "ring_exchange"}})
    assert ring["proj_fprop"] == T * 7 // 4 * h * 2
    # FP8: the all-gather buffers hold one byte an element; rs_dgrad moves qkv_dgrad to the reduce-scatters
    fp8 = buffers(T, h, 4, fp8=True, ub_cfgs={"qkv_dgrad": {"method": "ring_exchange"}})
    assert fp8["qkv_fprop"] == T * h and fp8["proj_fprop"] == T * h * 2
    assert fp8["qkv_dgrad"] == T * 7 // 4 * h * 2 and fp8["qkv_wgrad"] == T * h * 2
    assert buffers(T, h, 4, fp8=True, ub_cfgs={"fc2_fprop": {"method": "pipeline", "fp8_buf": 1}})["fc2_fprop"] == T * h
