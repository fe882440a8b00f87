"""Timed iterations of a bench: per-iteration forward/backward times, slowest rank, medians."""
from __future__ import annotations

import statistics
import time

import torch


class IterTimer:
    """Times forward and backward of each iteration: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.marks: list[tuple] = []

    def _mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def run(self, bench, iters: int) -> None:
        for _ in range(iters):
            t0 = self._mark()
            bench.forward()
            t1 = self._mark()
            bench.backward()
            t2 = self._mark()
            bench.zero_grad()
            self.marks.append((t0, t1, t2))

    def samples(self) -> dict[str, list[float]]:
        """Per-iteration milliseconds: fwd, bwd, total."""
        if self.cuda:
            torch.cuda.synchronize()
            el = lambda a, b: a.elapsed_time(b)  # noqa: E731
        else:
            el = lambda a, b: (b - a) * 1e3  # noqa: E731
        fwd = [el(a, b) for a, b, _ in self.marks]
        bwd = [el(b, c) for _, b, c in self.marks]
        return {"fwd_ms": fwd, "bwd_ms": bwd, "total_ms": [f + b for f, b in zip(fwd, bwd)]}


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def stats(samples: list[float]) -> dict:
    """Median and spread of one series; ``spread`` is the interquartile range relative to the median."""
    if not samples:
        return {"n": 0}
    med = statistics.median(samples)
    q1, q3 = _quantile(samples, 0.25), _quantile(samples, 0.75)
    return {
        "n": len(samples), "median": med, "mean": statistics.fmean(samples),
        "min": min(samples), "max": max(samples),
        "p10": _quantile(samples, 0.10), "p90": _quantile(samples, 0.90),
        "q1": q1, "q3": q3, "spread": (q3 - q1) / med if med else 0.0,
        "samples": [round(x, 6) for x in samples],
    }


def slowest_rank(per_rank: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Iteration i of a TP op takes as long as its slowest rank: element-wise max over ranks."""
    keys = per_rank[0].keys()
    return {k: [max(vals) for vals in zip(*(r[k] for r in per_rank))] for k in keys}
