import math

import pytest

from tptune.stats.noise import cheaper, compare, compare_points, cost_key, margin, relative_se

from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import make_point


def pt(case, median, rel=0.002, n=20):
    """Samples spread evenly over median·(1 ± rel)."""
    return make_point(case, [median * (1 - rel + 2 * rel * i / (n - 1)) for i in range(n)])


def test_tight_samples_give_the_floor():
    a, b = pt("qkv-tp2-none", 10.0), pt("qkv-tp2-nocomm", 10.0)
    assert margin(a, b) == 0.02
    assert margin(a, b, floor=0.05) == 0.05


def test_noisy_samples_widen_the_margin():
    a = pt("qkv-tp2-none", 10.0, rel=0.30, n=10)
    b = pt("qkv-tp2-nocomm", 10.0, rel=0.30, n=10)
    expected = 2.0 * math.hypot(relative_se(a), relative_se(b))
    assert expected > 0.02
    assert margin(a, b) == pytest.approx(expected)
    # IQR of evenly spread samples over ±30% is ~30% of the median: sigma ≈ 0.30/1.349 · 10
    assert relative_se(a) == pytest.approx(1.2533 * 0.30 / 1.349 / math.sqrt(10), rel=0.05)


def test_summary_percentiles_used_without_samples():
    p = MeasuredPoint.from_dict({"case": "qkv-tp2-none", "status": "ok",
                                 "timing": {"total_ms": {"median": 10.0, "p10": 9.0, "p90": 11.0, "n": 4}}})
    assert relative_se(p) == pytest.approx(1.2533 * (2.0 / 2.563) / 2 / 10.0)


def test_a_tie_within_the_margin():
    a, b = pt("qkv-tp2-none", 10.0), pt("qkv-tp2-nocomm", 10.15)
    m = margin(a, b)
    assert compare(a, b, m) == 0 and compare(b, a, m) == 0


def test_beyond_the_margin_the_faster_wins_both_ways():
    a, b = pt("qkv-tp2-none", 10.0), pt("qkv-tp2-nocomm", 10.5)
    m = margin(a, b)
    assert compare(a, b, m) == -1
    assert compare(b, a, m) == 1


def test_tie_goes_to_fewer_sms_even_if_slightly_slower():
    few = pt("qkv-tp4-ub.te+dgrad.bulk.sm4", 10.1)
    many = pt("qkv-tp4-ub.te+dgrad.bulk.sm16", 10.0)
    rec = compare_points(many, few)
    assert rec.outcome == 0
    assert rec.winner_case == "qkv-tp4-ub.te+dgrad.bulk.sm4"
    d = rec.to_dict()
    assert d["a"] == {"case": "qkv-tp4-ub.te+dgrad.bulk.sm16", "median_ms": 10.0}
    assert d["b"]["median_ms"] == pytest.approx(10.1)
    assert d["margin"] == 0.02 and d["reason"] == "tie: cheaper"


def test_clear_win_beats_cheapness():
    few = pt("qkv-tp4-ub.te+dgrad.bulk.sm4", 12.0)
    many = pt("qkv-tp4-ub.te+dgrad.bulk.sm16", 10.0)
    assert compare_points(few, many).winner_case == "qkv-tp4-ub.te+dgrad.bulk.sm16"


def test_failed_point_loses_and_two_failures_tie():
    ok = pt("fc1-tp2-none", 50.0)
    bad = make_point("fc1-tp2-chunked.n4", status="failed")
    assert compare(bad, ok, 0.02) == 1
    assert compare(ok, bad, 0.02) == -1
    assert compare(bad, make_point("fc1-tp2-chunked.n8", status="failed"), 0.02) == 0
    rec = compare_points(ok, bad).to_dict()
    assert rec["b"]["median_ms"] is None and rec["winner"] == "fc1-tp2-none"


def test_cost_order():
    order = ["qkv-tp2-ub.te+wgrad.bulk.sm8",       # smaller TP first
             "qkv-tp4-none",                       # no overlap before overlap
             "qkv-tp4-chunked.n2", "qkv-tp4-chunked.n4",
             # SMs of the op's effective ub_cfgs (TE defaults: fprop ring 1, dgrad/wgrad bulk 16 each)
             "qkv-tp4-ub.te+dgrad.bulk.sm2",       # 1 + 2 + 16
             "qkv-tp4-ub.te+dgrad.bulk",           # 1 + 16 + 16, the same setting as ub.te ...
             "qkv-tp4-ub.te+fprop.ring",           # ... and so is this: equal cost, then by id
             "qkv-tp4-ub.te+dgrad.bulk.sm24"]      # 1 + 24 + 16
    assert sorted(reversed(order), key=cost_key) == order
    assert cheaper("proj-tp4-ub.te+fprop.pipe.sm8", "proj-tp4-ub.te+fprop.ring") == "proj-tp4-ub.te+fprop.ring"


def test_tie_mode_must_be_known():
    with pytest.raises(ValueError):
        compare_points(pt("qkv-tp2-none", 1.0), pt("qkv-tp2-nocomm", 1.0), tie="left")
