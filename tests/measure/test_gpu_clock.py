"""worker.gpu_clock: NVML's clock-event reasons, one batch's clock from its samples, ranks and rounds
merged; and that a CPU device (or a machine without NVML) gives no sampler rather than an error."""
import torch

from tptune.measure import nvml
from tptune.measure.worker.gpu_clock import (clock_over_rounds, merge_ranks, open_clock, reason_names, summarize)


def test_reason_bits_have_nvml_names_and_unknown_bits_stay_visible():
    assert reason_names(0) == []
    assert reason_names(0x4) == ["sw_power_cap"]
    assert reason_names(0x4 | 0x20 | 0x1) == ["idle", "sw_power_cap", "sw_thermal"]
    assert reason_names(0x4 | 0x1000) == ["sw_power_cap", "0x1000"]


def test_a_batch_summary_takes_the_median_clock_and_the_hottest_sample():
    samples = [(1980, 41, 610.0, 0x0), (1830, 44, 700.0, 0x4), (1845, 45, 699.0, 0x4)]
    s = summarize(samples)
    assert s == {"sm_mhz": 1845, "sm_mhz_min": 1830, "sm_mhz_max": 1980, "temp_c": 45, "power_w": 699.0,
                 "reasons": ["sw_power_cap"], "samples": 3}
    assert summarize([]) is None


def test_ranks_merge_to_the_slowest_clock_and_every_reason():
    r0 = summarize([(1900, 40, 650.0, 0x0)] * 3)
    r1 = summarize([(1800, 47, 700.0, 0x4), (1820, 46, 700.0, 0x4)])
    m = merge_ranks([r0, r1, None])
    assert m["sm_mhz"] == 1810 and m["sm_mhz_min"] == 1800 and m["sm_mhz_max"] == 1900
    assert m["temp_c"] == 47 and m["power_w"] == 700.0 and m["reasons"] == ["sw_power_cap"] and m["samples"] == 2
    assert merge_ranks([None, None]) is None


def test_rounds_give_the_median_clock_and_their_range():
    rounds = [merge_ranks([summarize([(mhz, 40 + i, 600.0, 0x4)])]) for i, mhz in enumerate((1900, 1850, 1870))]
    c = clock_over_rounds(rounds + [None])
    assert c == {"sm_mhz": 1870, "sm_mhz_min": 1850, "sm_mhz_max": 1900, "temp_c": 42,
                 "reasons": ["sw_power_cap"], "rounds": 3}
    assert clock_over_rounds([None]) is None


def test_no_sampler_on_cpu_or_without_nvml(monkeypatch):
    assert open_clock(torch.device("cpu")) is None
    monkeypatch.setattr(nvml, "_lib", None)
    monkeypatch.setattr(nvml.ctypes, "CDLL", lambda name: (_ for _ in ()).throw(OSError(name)))
    assert nvml.library() is None
    assert open_clock(torch.device("cuda", 0)) is None      # NVML is checked before the CUDA device is touched


def test_each_iteration_gets_the_clock_sampled_inside_its_window():
    from tptune.measure.worker.gpu_clock import per_window
    at = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    mhz = [1600, 1600, 1500, 1400, 1400, 1400]
    # two samples in the first window, none in the second (nearest to its middle), three in the last
    assert per_window(at, mhz, [(0.0, 1.5), (1.6, 1.9), (3.0, 5.0)]) == [1600.0, 1500.0, 1400.0]
    # a window far from every sample (the host was still enqueueing then) gets none
    assert per_window(at, mhz, [(-10.0, -9.0), (4.5, 5.0)]) == [None, 1400.0]
    s = summarize([(m, 50, 690.0, 0x4) for m in mhz], at, [(0.0, 2.0), (2.5, 5.0)])
    assert s["iter_mhz"] == [1566.7, 1400.0]
    assert "iter_mhz" not in summarize([(m, 50, 690.0, 0x4) for m in mhz])


def test_ranks_merge_per_iteration_clocks_to_the_slower_rank():
    r0 = {**summarize([(1900, 40, 650.0, 0x0)]), "iter_mhz": [1900.0, 1800.0]}
    r1 = {**summarize([(1850, 40, 650.0, 0x0)]), "iter_mhz": [1850.0, 1820.0]}
    assert merge_ranks([r0, r1])["iter_mhz"] == [1850.0, 1800.0]
    r1["iter_mhz"] = [None, 1820.0]
    assert merge_ranks([r0, r1])["iter_mhz"] == [1900.0, 1800.0]
    assert merge_ranks([{**r0, "iter_mhz": [None, 1.0]}, {**r1, "iter_mhz": [None, 2.0]}])["iter_mhz"] == [None, 1.0]
    assert "iter_mhz" not in merge_ranks([r0, summarize([(1850, 40, 650.0, 0x0)])])   # one rank without them
