"""Timed batches of a bench: GPU time with the host ahead of the GPU (CUDA), wall-clock (CPU).

Why not per-iteration CUDA events alone: a Megatron-core TE layer takes the host 1.1-1.4 ms to launch
per fwd+bwd, as long as the GPU work of a small op. Events recorded while the host lags time the
host. So on CUDA a timed batch is enqueued while the GPU is held by a sleep kernel:

1. host_ms: the host's launch time per iteration, measured by enqueueing a few iterations.
2. Every rank sleeps the same length (the ranks' host estimates are all-reduced with MAX, so a rank
   never waits inside its timed window for a peer that slept longer), sized to cover the whole
   batch's launches with a safety factor.
3. After the sleep one tiny all-reduce lines the ranks' streams up before the first timed event.
4. The batch is enqueued with events around each iteration and between forward and backward.
5. Check: the host must finish enqueueing before the GPU finishes the sleep (enqueue_ms < slept_ms)
   on every rank. Otherwise the sleep is doubled and the batch measured again (``max_attempts``);
   the record says whether the host stayed ahead, so a report can flag a batch where it did not.

On CPU the host is the device: wall-clock marks per iteration, host_ms = the iteration time.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

SAFETY = 1.5                 # sleep = SAFETY x agreed host time of the batch + SLACK_MS
SLACK_MS = 1.0
MAX_ATTEMPTS = 4
HOST_PROBE_ITERS = 3
_CYCLES_PER_MS: dict[int, float] = {}


def cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of torch.cuda._sleep per millisecond on this GPU (measured once per process)."""
    idx = device.index or 0
    if idx not in _CYCLES_PER_MS:
        torch.cuda.synchronize(device)
        cycles = 5_000_000
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        _CYCLES_PER_MS[idx] = cycles / max(a.elapsed_time(b), 1e-3)
    return _CYCLES_PER_MS[idx]


def _iteration(bench) -> None:
    bench.forward()
    bench.backward()
    bench.zero_grad()


def host_launch_ms(bench, ctx, iters: int = HOST_PROBE_ITERS) -> float:
    """Host time to enqueue one fwd+bwd, with the GPU free (after a sync)."""
    ctx.sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        _iteration(bench)
    dt = (time.perf_counter() - t0) * 1e3 / iters
    ctx.sync()
    return dt


def _allreduce_host(values: list[float], group, op) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op, group=group)
    return t.tolist()


def _split(marks, elapsed) -> dict[str, list[float]]:
    fwd = [elapsed(a, b) for a, b, _ in marks]
    bwd = [elapsed(b, c) for _, b, c in marks]
    return {"fwd_ms": fwd, "bwd_ms": bwd, "total_ms": [f + b for f, b in zip(fwd, bwd)]}


def wall_batch(bench, iters: int) -> dict:
    """CPU: wall-clock per iteration (the host is the device)."""
    marks = []
    t_start = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        bench.forward()
        t1 = time.perf_counter()
        bench.backward()
        t2 = time.perf_counter()
        bench.zero_grad()
        marks.append((t0, t1, t2))
    samples = _split(marks, lambda a, b: (b - a) * 1e3)
    host = (time.perf_counter() - t_start) * 1e3 / max(iters, 1)
    return {"samples": samples, "host_ms": host, "timing": "wall"}


def gpu_batch(bench, ctx, iters: int, max_attempts: int = MAX_ATTEMPTS) -> dict:
    """CUDA: GPU time of ``iters`` iterations enqueued while the GPU sleeps (module doc)."""
    cpms = cycles_per_ms(ctx.device)
    host_probe = host_launch_ms(bench, ctx)
    agreed = _allreduce_host([host_probe], ctx.cpu_group, dist.ReduceOp.MAX)[0]
    sleep_ms = agreed * iters * SAFETY + SLACK_MS
    align = torch.zeros(1, device=ctx.device)
    attempts = []
    for attempt in range(max_attempts):
        ctx.sync()
        dist.barrier(group=ctx.cpu_group)
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s0.record()
        torch.cuda._sleep(int(sleep_ms * cpms))
        s1.record()
        if ctx.world_size > 1:
            dist.all_reduce(align, group=ctx.group)
        t_batch = time.perf_counter()
        marks = []
        for _ in range(iters):
            e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            e0.record()
            bench.forward()
            e1.record()
            bench.backward()
            e2.record()
            bench.zero_grad()
            marks.append((e0, e1, e2))
        t_end = time.perf_counter()
        ctx.sync()
        slept = s0.elapsed_time(s1)
        enqueue_ms = (t_end - t0) * 1e3
        rec = {"sleep_ms": sleep_ms, "slept_ms": slept, "enqueue_ms": enqueue_ms,
               "host_ms": (t_end - t_batch) * 1e3 / iters}
        ahead_local = enqueue_ms < slept
        ahead_all = _allreduce_host([1.0 if ahead_local else 0.0], ctx.cpu_group, dist.ReduceOp.MIN)[0] > 0
        rec["host_ahead"] = ahead_all
        attempts.append(rec)
        if ahead_all:
            break
        sleep_ms = max(sleep_ms * 2, enqueue_ms * SAFETY + SLACK_MS)
    samples = _split(marks, lambda a, b: a.elapsed_time(b))
    last = attempts[-1]
    return {"samples": samples, "host_ms": last["host_ms"], "host_probe_ms": host_probe,
            "host_agreed_ms": agreed, "host_ahead": last["host_ahead"], "attempts": attempts,
            "timing": "gpu_host_ahead"}


def event_batch(bench, ctx, iters: int) -> dict:
    """CUDA events per iteration with no sleep: the harness before GPU-time measurement, which times
    the host's launches whenever the host lags. Kept for benchmarks/measure_noise.py to show the gap."""
    marks = []
    t0 = time.perf_counter()
    for _ in range(iters):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        bench.forward()
        e1.record()
        bench.backward()
        e2.record()
        bench.zero_grad()
        marks.append((e0, e1, e2))
    host = (time.perf_counter() - t0) * 1e3 / iters
    ctx.sync()
    return {"samples": _split(marks, lambda a, b: a.elapsed_time(b)), "host_ms": host, "timing": "events"}


def timed_batch(bench, ctx, iters: int, mode: str = "gpu") -> dict:
    """mode "gpu": host-ahead GPU time (CUDA) / wall clock (CPU); "events": per-iteration events."""
    if not ctx.is_cuda:
        return wall_batch(bench, iters)
    return event_batch(bench, ctx, iters) if mode == "events" else gpu_batch(bench, ctx, iters)
