"""What the GPU's clock did while a batch ran: SM clock, temperature, power and the reasons NVML gives
for holding the clock down, read (never set) through NVML while the host waits for the batch.

Why: the same op moves by up to ~4% from call to call on an H200 under its power cap, with the harness
holding the host ahead (results/noise-x2). A GEMM-bound op's time scales with 1/SM clock, so recording
the clock beside every batch tells machine drift (the card's power and thermal management, which we
must measure as we find it) from a harness fault, and lets the noise benchmark show the spread of
time x clock (cycles) beside the spread of time.

NVML is the driver's library (libnvidia-ml.so.1), loaded with ctypes: no Python package needed. Where
it is absent (CPU machines, containers without it) ``open_clock`` returns None and batches carry no
clock figures.
"""
from __future__ import annotations

import bisect
import ctypes
import statistics

from tptune.measure import nvml

# nvmlClocksEventReasons (nvml.h); "GpuIdle" and the settings bits are NVML's names shortened
REASONS = {0x1: "idle", 0x2: "app_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
           0x10: "sync_boost", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake",
           0x100: "display_clock_setting"}
_NVML_CLOCK_SM = 1
_NVML_TEMPERATURE_GPU = 0


def reason_names(mask: int) -> list[str]:
    """NVML's clock-event reason bits as names (unknown bits as hex)."""
    names = [n for bit, n in REASONS.items() if mask & bit]
    rest = mask & ~sum(REASONS)
    return names + ([hex(rest)] if rest else [])


class GpuClock:
    """Samples one GPU's clock, temperature, power and clock-event reasons through NVML."""

    def __init__(self, lib, handle):
        self._lib, self._handle = lib, handle
        get = getattr(lib, "nvmlDeviceGetCurrentClocksEventReasons", None)
        self._reasons = get or lib.nvmlDeviceGetCurrentClocksThrottleReasons

    def sample(self) -> tuple[int, int, float, int] | None:
        """(SM MHz, temperature C, power W, reason bits), or None if NVML refused a query."""
        mhz, temp, mw, reasons = ctypes.c_uint(), ctypes.c_uint(), ctypes.c_uint(), ctypes.c_ulonglong()
        h = self._handle
        if (self._lib.nvmlDeviceGetClockInfo(h, _NVML_CLOCK_SM, ctypes.byref(mhz))
                or self._lib.nvmlDeviceGetTemperature(h, _NVML_TEMPERATURE_GPU, ctypes.byref(temp))
                or self._lib.nvmlDeviceGetPowerUsage(h, ctypes.byref(mw))
                or self._reasons(h, ctypes.byref(reasons))):
            return None
        return mhz.value, temp.value, mw.value / 1e3, reasons.value


def open_clock(device) -> GpuClock | None:
    """A sampler for the CUDA ``device`` (matched to NVML by UUID, so CUDA_VISIBLE_DEVICES cannot
    misplace it), or None where NVML or the device is not available."""
    import torch

    if getattr(device, "type", None) != "cuda":
        return None
    lib = nvml.library()
    if lib is None:
        return None
    props = torch.cuda.get_device_properties(device)
    handle = nvml.handle(str(props.uuid))
    if handle is not None:
        return GpuClock(lib, handle)
    handle = ctypes.c_void_p()
    if hasattr(props, "pci_bus_id"):
        bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
        if lib.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), ctypes.byref(handle)) == 0:
            return GpuClock(lib, handle)
    return None


def summarize(samples: list[tuple[int, int, float, int]], at: list[float] | None = None,
              windows: list[tuple[float, float]] | None = None) -> dict | None:
    """One batch's clock record from its samples: SM MHz median/min/max, hottest C, median W, reasons seen.
    With the samples' host times ``at`` and each timed iteration's host-time window, also the SM clock of
    every iteration (``iter_mhz``, see per_window)."""
    if not samples:
        return None
    mhz = [s[0] for s in samples]
    mask = 0
    for s in samples:
        mask |= s[3]
    rec = {"sm_mhz": statistics.median(mhz), "sm_mhz_min": min(mhz), "sm_mhz_max": max(mhz),
           "temp_c": max(s[1] for s in samples), "power_w": statistics.median(s[2] for s in samples),
           "reasons": reason_names(mask), "samples": len(samples)}
    if at is not None and windows:
        rec["iter_mhz"] = per_window(at, mhz, windows)
    return rec


def per_window(at: list[float], values: list[float], windows: list[tuple[float, float]]) -> list[float | None]:
    """The mean of the samples taken inside each window (t0, t1); a window no sample fell in gets the
    sample nearest its middle if that lies within 1.5 window lengths of it, else None (the host samples
    only once it has enqueued the batch, so a long batch's first iterations may have none). ``at`` is
    ascending (sampling order), so each window is a bisection, not a scan: a 500 ms window has hundreds
    of iterations and samples, and this runs after every batch.
    Why per iteration: a step of GPU time inside one batch that the clock steps with is the card's
    clock management; one the clock does not follow is not (or not one NVML reports)."""
    out = []
    for t0, t1 in windows:
        lo, hi = bisect.bisect_left(at, t0), bisect.bisect_right(at, t1)
        inside = values[lo:hi]
        if not inside and at:
            mid = (t0 + t1) / 2
            near = [i for i in (lo - 1, lo) if 0 <= i < len(at)]
            i = min(near, key=lambda j: abs(at[j] - mid))
            inside = [values[i]] if abs(at[i] - mid) <= 1.5 * (t1 - t0) else []
        out.append(round(sum(inside) / len(inside), 1) if inside else None)
    return out


def _span(recs: list[dict]) -> dict:
    """What clock records share when merged: the SM clock's range, the hottest C, every reason."""
    return {"sm_mhz_min": min(r["sm_mhz_min"] for r in recs), "sm_mhz_max": max(r["sm_mhz_max"] for r in recs),
            "temp_c": max(r["temp_c"] for r in recs), "reasons": sorted({n for r in recs for n in r["reasons"]})}


def merge_ranks(records: list[dict | None]) -> dict | None:
    """The clock of a batch over its ranks: the slowest rank's SM clock (a collective waits for it),
    the hottest temperature, the highest power, every reason any rank gave."""
    recs = [r for r in records if r]
    if not recs:
        return None
    merged = {"sm_mhz": min(r["sm_mhz"] for r in recs), **_span(recs), "power_w": max(r["power_w"] for r in recs),
              "samples": min(r["samples"] for r in recs)}
    iters = [r.get("iter_mhz") for r in recs]
    if all(iters) and len({len(x) for x in iters}) == 1:
        merged["iter_mhz"] = [min((x for x in v if x), default=None) for v in zip(*iters)]
    return merged


def clock_over_rounds(records: list[dict | None]) -> dict | None:
    """A point's clock: the median of its rounds' SM clocks, their range, every reason seen."""
    recs = [r for r in records if r]
    if not recs:
        return None
    return {"sm_mhz": statistics.median(r["sm_mhz"] for r in recs), **_span(recs), "rounds": len(recs)}
