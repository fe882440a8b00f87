"""Runs one case on every rank: build, warm up, time one batch, optionally profile and check, close:
the life of a bench (worker.bench), the same on every backend.

The client (launch.Session) asks for one case at a time and alternates the members of a session
round after round; each request builds the case afresh (userbuffers included), so the spread
between rounds holds the variation between builds, not only between iterations.

A packed layer case (worker.packed) is timed twice per round with the same timing code: fwd+bwd, then its
forward alone under torch.no_grad() (RL's log-prob and reference passes), kept as samples "fwd_only_ms"
beside fwd_ms / bwd_ms / total_ms and its batch as batch["forward_only"]; its result carries ``pack``
(T, real tokens, padding, the lengths).
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

from tptune.cases import Case
from tptune.measure.worker import te_backend, torch_backend
from tptune.measure.worker.bench import Bench
from tptune.measure.worker.context import RankContext
from tptune.measure.worker.packed import ForwardOnly
from tptune.measure.worker.te_block import TeBlockBench
from tptune.measure.worker.timing import MAX_ATTEMPTS, PREROLL_MS, WINDOW_MS, timed_batch
from tptune.measure.worker.torch_block import TorchBlockBench
from tptune.model.ops import LAYER, op_mix, primary_shape
from tptune.model.spec import ModelConfig
from tptune.records.files import write_via_buffer

# Each backend's op module (its build(case, mc, ctx, settings) builds one op's bench) and block bench.
# The block modules build on their backend's op module, never the other way round.
_BACKENDS = {"torch": torch_backend, "te": te_backend}
FWD_ONLY = "fwd_only_ms"   # a packed case's forward alone under no_grad, per timed iteration
_BLOCKS = {"torch": TorchBlockBench, "te": TeBlockBench}


def load_backend(name: str):
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}: expected torch or te")
    return _BACKENDS[name]


def build_bench(name: str, case: Case, mc: ModelConfig, ctx: RankContext, settings: dict) -> Bench:
    """The bench of one case on backend ``name``: a whole block for the layer stage, else one op."""
    backend = load_backend(name)
    if case.op != LAYER:
        return backend.build(case, mc, ctx, settings)
    return _BLOCKS[name](case, mc, ctx, settings)


def _warm_up(bench: Bench, ctx: RankContext, iters: int) -> None:
    """``iters`` untimed fwd+bwd, then every rank waits for the others before the timed batch."""
    for _ in range(iters):
        bench.forward()
        bench.backward()
        bench.zero_grad()
    ctx.sync()
    dist.barrier(group=ctx.cpu_group)


def _profile(bench: Bench, ctx: RankContext, steps: int, out_dir: Path) -> str:
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
    def compress(out) -> None:
        with open(raw, "rb") as src, gzip.GzipFile(fileobj=out, mode="wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)

    write_via_buffer(gz, compress)     # whole or not at all: analysis never reads a cut trace
    raw.unlink()
    return gz.name


def _mix(case: Case, mc: ModelConfig) -> list:
    """The shapes ``case`` is measured at and each one's share of the op's runs per step: [(OpShape, share)]
    when its op runs at more than one shape under its one communicator config (ops.op_mix), else []."""
    if case.op == LAYER:
        return []
    mix = op_mix(case.op, mc)
    return mix if len(mix) > 1 else []


def run_case(case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, out_dir: Path) -> dict:
    """Measure ``case`` on this rank once (one round). Raises on failure (the server reports it).

    settings: timing {warmup, iters, profile_steps}, profile (bool: record traces this time),
    check (bool: numerics against the no-overlap layer this time).

    An op that runs at several shapes under one communicator config (fc1/fc2 of a model with dense
    layers and shared experts of another width) is measured at each, one after the other in this round;
    its samples are the per-iteration mix, sum over shapes of share x time (iteration i of each shape,
    over the fewest iterations any shape timed), so the round's value, and the paired per-round ratios
    built on it, are of the model's mix. "shapes" keeps each shape's own samples. The trace and the
    numerics check are of the most frequent shape (ops.primary_shape)."""
    mix = _mix(case, mc)
    if not mix:
        return _run_shape(case, mc, ctx, settings, out_dir)
    primary = primary_shape(case.op, mc)
    per, first = [], None
    for shape, share in mix:
        main = shape == primary
        res = _run_shape(case, mc, ctx, {**settings, "shape": [shape.k_in, shape.n_out],
                                         **({} if main else {"profile": False, "check": False})}, out_dir)
        per.append((shape, share, res))
        if main:
            first = res
    n = min(len(r["samples"]["total_ms"]) for _, _, r in per)
    samples = {k: [sum(share * r["samples"][k][i] for _, share, r in per) for i in range(n)]
               for k in first["samples"]}
    out = dict(first)
    out["samples"] = samples
    out["shapes"] = [{"what": s.what, "k_in": s.k_in, "n_out": s.n_out, "layers": s.layers, "share": share,
                      "samples": r["samples"]} for s, share, r in per]
    for k in ("init_s", "measure_s", "total_s", "close_s"):
        out[k] = sum(r[k] for _, _, r in per)
    return out


def _run_shape(case: Case, mc: ModelConfig, ctx: RankContext, settings: dict, out_dir: Path) -> dict:
    """One build and timed batch of ``case`` (at settings["shape"], [k_in, n_out], where given)."""
    timing = settings["timing"]
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    bench = build_bench(settings["backend"], case, mc, ctx, settings)
    try:
        t_init = time.perf_counter() - t0
        _warm_up(bench, ctx, timing["warmup"])
        batch = timed_batch(bench, ctx, timing["iters"], timing.get("mode", "gpu"),
                            preroll_ms=timing.get("preroll_ms", PREROLL_MS),
                            window_ms=timing.get("window_ms", WINDOW_MS), warmed=timing["warmup"],
                            max_attempts=timing.get("host_attempts", MAX_ATTEMPTS))
        pack = getattr(bench, "pack", None)
        if pack is not None:   # the forward alone too, as RL's log-prob / reference passes run it
            fwd_only = timed_batch(ForwardOnly(bench), ctx, timing["iters"], timing.get("mode", "gpu"),
                                   preroll_ms=timing.get("preroll_ms", PREROLL_MS),
                                   window_ms=timing.get("window_ms", WINDOW_MS),
                                   max_attempts=timing.get("host_attempts", MAX_ATTEMPTS))
            batch["samples"][FWD_ONLY] = fwd_only.pop("samples")["fwd_ms"]
            batch["forward_only"] = fwd_only
        t_measure = time.perf_counter() - t0 - t_init
        trace = None
        if settings.get("profile") and timing.get("profile_steps"):
            trace = _profile(bench, ctx, timing["profile_steps"], out_dir)
        check = bench.correctness() if settings.get("check") else None
        result = {"rank": ctx.rank, "samples": batch.pop("samples"), "batch": batch, "trace": trace,
                  "correctness": check, "init_s": t_init, "measure_s": t_measure,
                  "total_s": time.perf_counter() - t0, "pid": os.getpid(),
                  **({"pack": pack.record()} if pack is not None else {})}
    finally:
        t_close = time.perf_counter()
        bench.close()
        if ctx.is_cuda:
            torch.cuda.empty_cache()
    result["close_s"] = time.perf_counter() - t_close
    return result
