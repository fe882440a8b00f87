"""Runs one case on every rank: build, warm up, time one batch, optionally profile and check.

The client (launch.Session) asks for one case at a time and alternates the members of a session
round after round; each request builds the case afresh (userbuffers included), so the spread
between rounds holds the variation between builds, not only between iterations.
"""
from __future__ import annotations

import gzip
import os
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from ..cases import Case
from ..model import ModelConfig
from .context import RankContext
from .timing import PREROLL_MS, WINDOW_MS, timed_batch


def load_backend(name: str):
    if name == "torch":
        from . import torch_backend
        return torch_backend
    if name == "te":
        from . import te_backend
        return te_backend
    raise ValueError(f"unknown backend {name!r}: expected torch or te")


def _profile(bench, ctx: RankContext, steps: int, out_dir: Path) -> str:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.is_cuda else [])
    raw = out_dir / f"trace.rank{ctx.rank}.json"
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps),
                 on_trace_ready=lambda p: p.export_chrome_trace(str(raw))) as prof:
        for _ in range(steps + 1):
            with record_function("tptune.forward"):
                bench.forward()
            with record_function("tptune.backward"):
                bench.backward()
            bench.zero_grad()
            prof.step()
    ctx.sync()
    gz = raw.with_suffix(".json.gz")
    with open(raw, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
        shutil.copyfileobj(src, dst)
    raw.unlink()
    return gz.name


def run_case(case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, out_dir: Path) -> dict:
    """Measure ``case`` on this rank once (one round). Raises on failure (the server reports it).

    settings: timing {warmup, iters, profile_steps}, profile (bool: record traces this time),
    check (bool: numerics against the no-overlap layer this time)."""
    timing = settings["timing"]
    backend = load_backend(settings["backend"])
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bench = backend.build(case, mc, ctx, settings)
    try:
        t_init = time.perf_counter() - t0
        for _ in range(timing["warmup"]):
            bench.forward()
            bench.backward()
            bench.zero_grad()
        ctx.sync()
        dist.barrier(group=ctx.cpu_group)
        batch = timed_batch(bench, ctx, timing["iters"], timing.get("mode", "gpu"),
                            preroll_ms=timing.get("preroll_ms", PREROLL_MS),
                            window_ms=timing.get("window_ms", WINDOW_MS), warmed=timing["warmup"])
        t_measure = time.perf_counter() - t0 - t_init
        trace = None
        if settings.get("profile") and timing.get("profile_steps"):
            trace = _profile(bench, ctx, timing["profile_steps"], out_dir)
        check = None
        if settings.get("check") and hasattr(bench, "correctness"):
            check = bench.correctness()
        result = {"rank": ctx.rank, "samples": batch.pop("samples"), "batch": batch, "trace": trace,
                  "correctness": check, "init_s": t_init, "measure_s": t_measure,
                  "total_s": time.perf_counter() - t0, "pid": os.getpid()}
    finally:
        t_close = time.perf_counter()
        bench.close()
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    result["close_s"] = time.perf_counter() - t_close
    return result
