"""Timed batches of a bench: GPU time with the host ahead of the GPU (CUDA), wall-clock (CPU).

Why not per-iteration CUDA events alone: a Megatron-core TE layer takes the host 1.1-1.4 ms to launch
per fwd+bwd, as long as the GPU work of a small op. Events recorded while the host lags time the
host. So on CUDA the timed iterations are enqueued before the GPU reaches them:

1. A probe of a few iterations gives the host's launch time and the GPU time per iteration; the
   ranks agree on both (all-reduce MAX), so every rank sizes its lead alike and no rank waits in its
   timed window for a peer that was held longer.
2. The stream is held by a short sleep, then runs untimed pre-roll iterations of the bench itself
   (PREROLL_MS of its GPU work with the warm-up and probe iterations run just before, which count
   toward it: on fc1 they are 110 of the 150 ms), then the timed iterations: ``iters``, or for a GPU-bound op
   (host < GPU / FED_MARGIN) as many as fill WINDOW_MS of GPU time (timed_iters says why). The sleep is
   sized so that the host enqueues the pre-roll (GPU-bound: its lead then grows through the timed
   iterations) or everything (host-bound) before the GPU leaves the pre-roll; for GPU-bound ops the
   pre-roll alone usually gives that lead. The pre-roll is also what makes the timing reproducible: on
   2xH200 every op slowed by about 8% over its first ~100 ms of work after an idle spell (the clock
   settling from boost to the op's loaded level; results/noise-x2, noise-sleep-preroll25), and a batch timed in that transient moved from call
   to call. Holding with large GEMMs instead settled the clock below the op's own level. Training
   keeps the GPU loaded with the layer's own work; the pre-roll does too.
3. After the sleep, one tiny all-reduce lines the ranks' streams up.
4. The timed iterations: events around each iteration and between forward and backward.
5. Check, on every rank, one of:
   - lead: the host finished enqueueing before the GPU finished the hold (sleep + pre-roll):
     enqueue_ms < slept_ms (GPU time from the sleep's start to the first timed event);
   - queue: the launch queue, not the host, held the enqueue back. CUDA queues about a thousand
     launches per stream; a whole block's fwd+bwd is hundreds of kernels, and a 500 ms window of a
     small op hundreds of iterations, so such a batch cannot be enqueued during any hold: the host
     waits for free slots and the lead check cannot pass (on 2xH200 a 2-layer block's 12 iterations
     took 610 ms to enqueue against 80 ms of GPU each, while the host launched one in 9-15 ms with the
     GPU free). A queue that is full cannot starve the GPU, and a GPU-bound host (the probe, GPU free)
     refills it faster than the GPU drains it. So the batch counts when the host had begun the timed
     iterations before the GPU reached them (entered_ms < slept_ms), the probe says GPU-bound, and no
     timed mark found the GPU idle (an event complete right after it is recorded sat behind nothing).
   Otherwise the sleep grows and the batch is measured again (``max_attempts``); the record says
   whether the host stayed ahead and by which check, so a report can flag a batch where it did not.
   In a session, a member whose last batch fell behind after every attempt gets one attempt in its next
   round (launch.host_attempts): a host-bound block (Qwen3-30B-A3B's MoE block on 2x H100: every batch of
   every setting, 4 attempts each, never ahead) spent three quarters of its session retrying.
   A host-bound op (host >= GPU / FED_MARGIN) also gets a 4x shorter pre-roll on each retry (down to
   PREROLL_MIN): its pre-roll's launches can fill CUDA's launch queue, after which the host waits for
   the GPU through the sleep and falls behind it afterwards, however long the sleep (on x2, FP8 qkv under
   current scaling: 60 pre-roll iterations of 34 launches; the enqueue took the sleep plus ~30 ms at
   every sleep length, 4 attempts, every round). A shorter pre-roll times the op nearer the boost clock
   of an idle GPU (the record keeps each attempt's pre-roll).
   host_ms is the host's launch time per iteration (the probe, GPU free), its own figure (an op is
   host-bound when host >= GPU).
6. While the host waits for the timed iterations, it samples the GPU's SM clock, temperature, power and
   NVML's clock-event reasons (read only, worker.gpu_clock): the record of what the card's power and
   thermal management did to this batch, per batch and per timed iteration (each sample placed by its
   host time against the iteration's events, which step 2's sleep-start event ties to host time).

On CPU the host is the device: wall-clock marks per iteration, host_ms = the iteration time.
"""
from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from tptune.measure.worker import gpu_clock

SAFETY = 2.0                 # the host's lead covers SAFETY x its agreed enqueue time + SLACK_MS
FED_MARGIN = 1.25            # a host that launches an iteration in under 1/FED_MARGIN of its GPU time keeps ahead
SLACK_MS = 2.0
PREROLL_MS = 150.0           # the bench's own GPU work run untimed before the timed iterations
WINDOW_MS = 500.0            # GPU-bound ops: at least this much GPU time is timed per batch
WINDOW_MAX_ITERS = 600
PREROLL_MAX = 60
PREROLL_MIN = 2
MAX_ATTEMPTS = 4
HOST_PROBE_ITERS = 3
CLOCK_POLL_S = 0.0005        # NVML sampling interval while the host waits for a timed batch
_CYCLES_PER_MS: dict[int, float] = {}
_CLOCKS: dict[int, object] = {}


def cycles_per_ms(device: torch.device) -> float:
    """Clock cycles of torch.cuda._sleep per millisecond on this GPU (measured once per process)."""
    idx = device.index or 0
    if idx not in _CYCLES_PER_MS:
        torch.cuda.synchronize(device)
        cycles = 2_000_000
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        torch.cuda._sleep(cycles)
        b.record()
        b.synchronize()
        _CYCLES_PER_MS[idx] = cycles / max(a.elapsed_time(b), 1e-3)
    return _CYCLES_PER_MS[idx]


def _clock(device: torch.device):
    idx = device.index or 0
    if idx not in _CLOCKS:
        _CLOCKS[idx] = gpu_clock.open_clock(device)
    return _CLOCKS[idx]


def _sample_clock_until(clock, first, last) -> tuple[list, list[float]]:
    """While the GPU runs the timed iterations (``first`` event done, ``last`` not yet), sample its
    clock; the host has nothing else to do then, so the sampling costs the timing nothing.
    Returns the samples and the host time (perf_counter) of each."""
    samples, at = [], []
    if clock is None:
        return samples, at
    while not last.query():
        if first.query():
            s = clock.sample()
            if s is not None:
                samples.append(s)
                at.append(time.perf_counter())
        time.sleep(CLOCK_POLL_S)
    return samples, at


def iteration_windows(t0: float, start, marks) -> list[tuple[float, float]]:
    """Each timed iteration's span in host time (perf_counter s): ``start`` is an event recorded at host
    time ``t0`` on an idle GPU, so it ran then, and every later event ran start.elapsed_time(it) after."""
    return [(t0 + start.elapsed_time(a) / 1e3, t0 + start.elapsed_time(c) / 1e3) for a, _, c in marks]


def _iteration(bench) -> None:
    bench.forward()
    bench.backward()
    bench.zero_grad()


def host_launch_ms(bench, ctx, iters: int = HOST_PROBE_ITERS) -> tuple[float, float]:
    """(host ms to enqueue one fwd+bwd with the GPU free, GPU ms of one fwd+bwd) from a short probe."""
    ctx.sync()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    for _ in range(iters):
        _iteration(bench)
    b.record()
    dt = (time.perf_counter() - t0) * 1e3 / iters
    ctx.sync()
    return dt, a.elapsed_time(b) / iters


def _marked_iterations(bench, iters: int, mark) -> list[tuple]:
    """``iters`` fwd+bwd with a mark before, between and after each (``mark()`` returns the mark)."""
    marks = []
    for _ in range(iters):
        m0 = mark()
        bench.forward()
        m1 = mark()
        bench.backward()
        m2 = mark()
        bench.zero_grad()
        marks.append((m0, m1, m2))
    return marks


def _event():
    e = torch.cuda.Event(enable_timing=True)
    e.record()
    return e


def _event_iterations(bench, iters: int, idle: list | None = None) -> list[tuple]:
    """Enqueue ``iters`` fwd+bwd with CUDA events before, between and after (read after a sync).
    ``idle`` (a list) gets one entry per event found complete right after it was recorded: the GPU
    had run out of work there."""
    if idle is None:
        return _marked_iterations(bench, iters, _event)

    def mark():
        e = _event()
        if e.query():
            idle.append(1)
        return e
    return _marked_iterations(bench, iters, mark)


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
    t_start = time.perf_counter()
    marks = _marked_iterations(bench, iters, time.perf_counter)
    samples = _split(marks, lambda a, b: (b - a) * 1e3)
    host = (time.perf_counter() - t_start) * 1e3 / max(iters, 1)
    return {"samples": samples, "host_ms": host, "timing": "wall"}


def gpu_bound(host_ms: float, gpu_ms: float) -> bool:
    """The host launches an iteration in under 1/FED_MARGIN of its GPU time: once ahead, it stays ahead."""
    return host_ms * FED_MARGIN < gpu_ms


def batch_checks(enqueue_ms: float, slept_ms: float, host_ms: float, gpu_ms: float,
                 idle_marks: int, entered_ms: float | None = None) -> tuple[bool, bool]:
    """(lead, fed) of one rank's batch (module doc, step 5): lead = the host finished enqueueing before
    the GPU left the hold; fed = lead, or the host entered the timed iterations before the GPU reached
    them (``entered_ms``, when given) and, however the launch queue held it back, refills the queue
    faster than the GPU drains it (gpu_bound) with no timed mark finding the GPU idle."""
    lead = enqueue_ms < slept_ms
    entered = entered_ms is None or entered_ms < slept_ms
    return lead, lead or (entered and gpu_bound(host_ms, gpu_ms) and idle_marks == 0)


def timed_iters(iters: int, host_ms: float, gpu_ms: float, window_ms: float) -> int:
    """Timed iterations of a batch: ``iters``, or for a GPU-bound op as many as fill ``window_ms`` of GPU
    time (at most WINDOW_MAX_ITERS). Why: on 2xH200 under the power cap an op's time steps up by up to
    ~19% in episodes of ~50-300 ms that NVML's SM clock does not show (results/noise-x2); a
    10-iteration batch (28-184 ms) caught one or not, so its median moved from call to call (worst
    over 7 calls 11.7%), and a 500 ms window's median rides them out (3.1%; 250 ms: 9.0%). A host-bound
    op keeps ``iters``: its host must enqueue the whole batch during the hold."""
    if window_ms <= 0 or not gpu_bound(host_ms, gpu_ms):
        return iters
    return max(iters, min(WINDOW_MAX_ITERS, math.ceil(window_ms / max(gpu_ms, 1e-3))))


def needed_sleep_ms(host_ms: float, gpu_ms: float, iters: int, preroll: int) -> float:
    """The hold the host needs, beyond what the pre-roll's GPU time gives it, to enqueue the pre-roll
    (a GPU-bound op: its host gains on the GPU through the timed iterations) or pre-roll and batch."""
    n = preroll if gpu_bound(host_ms, gpu_ms) else preroll + iters
    return max(SLACK_MS, host_ms * n * SAFETY + SLACK_MS - preroll * gpu_ms)


def retry_plan(sleep_ms: float, preroll: int, enqueue_ms: float, host_ms: float, gpu_ms: float,
               iters: int) -> tuple[float, int]:
    """(sleep, pre-roll) of the next attempt after a batch whose host fell behind: a longer sleep; for a
    host-bound op also a 4x shorter pre-roll (module doc, step 5), and the sleep that one needs."""
    if not gpu_bound(host_ms, gpu_ms) and preroll > PREROLL_MIN:
        preroll = max(PREROLL_MIN, preroll // 4)
    return max(sleep_ms * 2, enqueue_ms * SAFETY + SLACK_MS, needed_sleep_ms(host_ms, gpu_ms, iters, preroll)), preroll


def preroll_iters(preroll_ms: float, gpu_ms: float, warm_iters: int = 0) -> int:
    """Untimed iterations before the timed ones: enough for ``preroll_ms`` of the op's GPU work, less the
    ``warm_iters`` it ran just before (the warm-up and the probe: the same work, a few ms of idle away),
    at least PREROLL_MIN; at most PREROLL_MAX (scaled with a longer pre-roll)."""
    most = max(PREROLL_MAX, int(PREROLL_MAX * preroll_ms / PREROLL_MS))
    left = preroll_ms - warm_iters * gpu_ms
    return min(most, max(PREROLL_MIN, math.ceil(left / max(gpu_ms, 1e-3))))


def gpu_batch(bench, ctx, iters: int, max_attempts: int = MAX_ATTEMPTS, preroll_ms: float = PREROLL_MS,
              window_ms: float = WINDOW_MS, warmed: int = 0) -> dict:
    """CUDA: GPU time of ``iters`` iterations (or a ``window_ms`` window, timed_iters) enqueued while the
    GPU is held (module doc). ``warmed``: warm-up iterations run just before, which with the probe's
    count toward the pre-roll."""
    cpms = cycles_per_ms(ctx.device)
    host_probe, gpu_probe = host_launch_ms(bench, ctx)
    agreed, gpu_agreed = _allreduce_host([host_probe, gpu_probe], ctx.cpu_group, dist.ReduceOp.MAX)
    iters = timed_iters(iters, agreed, gpu_agreed, window_ms)     # agreed values: every rank runs as many
    preroll = preroll_iters(preroll_ms, gpu_agreed, warmed + HOST_PROBE_ITERS)
    sleep_ms = needed_sleep_ms(agreed, gpu_agreed, iters, preroll)
    align = torch.zeros(1, device=ctx.device)
    attempts = []
    for attempt in range(max_attempts):
        ctx.sync()
        dist.barrier(group=ctx.cpu_group)
        s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s0.record()
        torch.cuda._sleep(int(sleep_ms * cpms))
        if ctx.world_size > 1:
            dist.all_reduce(align, group=ctx.group)
        for _ in range(preroll):
            _iteration(bench)
        s1.record()
        t_batch = time.perf_counter()
        idle: list = []
        marks = _event_iterations(bench, iters, idle)
        t_end = time.perf_counter()
        clock_samples, at = _sample_clock_until(_clock(ctx.device), marks[0][0], marks[-1][2])
        ctx.sync()
        clock = gpu_clock.summarize(clock_samples, at, iteration_windows(t0, s0, marks)) if clock_samples else None
        slept = s0.elapsed_time(s1)
        enqueue_ms = (t_end - t0) * 1e3
        # host_ms of the batch is capped by the launch queue once the pre-roll fills it: the probe's
        # figure (GPU free) is the host's launch time
        entered_ms = (t_batch - t0) * 1e3
        rec = {"sleep_ms": sleep_ms, "slept_ms": slept, "enqueue_ms": enqueue_ms, "entered_ms": entered_ms,
               "preroll": preroll, "iters": iters, "batch_host_ms": (t_end - t_batch) * 1e3 / iters,
               "idle_marks": len(idle), "clock": clock}
        lead, fed = batch_checks(enqueue_ms, slept, agreed, gpu_agreed, len(idle), entered_ms)
        lead_all, ahead_all = (x > 0 for x in _allreduce_host([float(lead), float(fed)],
                                                              ctx.cpu_group, dist.ReduceOp.MIN))
        rec["host_ahead"] = ahead_all
        rec["check"] = "lead" if lead_all else "queue" if ahead_all else "failed"
        attempts.append(rec)
        if ahead_all:
            break
        sleep_ms, preroll = retry_plan(sleep_ms, preroll, enqueue_ms, agreed, gpu_agreed, iters)
    samples = _split(marks, lambda a, b: a.elapsed_time(b))
    last = attempts[-1]
    return {"samples": samples, "host_ms": host_probe, "host_probe_ms": host_probe,
            "host_agreed_ms": agreed, "gpu_probe_ms": gpu_probe, "host_ahead": last["host_ahead"], "attempts": attempts,
            "timing": "gpu_host_ahead"}


def event_batch(bench, ctx, iters: int) -> dict:
    """CUDA events per iteration with no hold: the harness before GPU-time measurement, which times
    the host's launches whenever the host lags. Kept for benchmarks/measure_noise.py to show the gap."""
    t0 = time.perf_counter()
    marks = _event_iterations(bench, iters)
    host = (time.perf_counter() - t0) * 1e3 / iters
    ctx.sync()
    return {"samples": _split(marks, lambda a, b: a.elapsed_time(b)), "host_ms": host, "timing": "events"}


def timed_batch(bench, ctx, iters: int, mode: str = "gpu", preroll_ms: float = PREROLL_MS,
                window_ms: float = WINDOW_MS, warmed: int = 0, max_attempts: int = MAX_ATTEMPTS) -> dict:
    """mode "gpu": host-ahead GPU time (CUDA) / wall clock (CPU); "events": per-iteration events."""
    if not ctx.is_cuda:
        return wall_batch(bench, iters)
    if mode == "events":
        return event_batch(bench, ctx, iters)
    return gpu_batch(bench, ctx, iters, max_attempts=max_attempts, preroll_ms=preroll_ms, window_ms=window_ms,
                     warmed=warmed)
