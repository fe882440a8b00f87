"""Timed iterations of a bench: per-iteration forward/backward times, slowest rank, medians."""
from __future__ import annotations

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


