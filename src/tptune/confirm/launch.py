"""One confirm launch's result: its log read (confirm.megatron_log), its iteration time, its failure (exit status,
OOM, a userbuffers assert, a hang) with the first error lines. The launches themselves run in a launch group
(confirm.group over confirm.rank_runner).

The iteration time of a launch (``iteration_ms``, the value every ratio uses): the mean over iterations
``timed_from`` on of the GPU-timed iterations tptune's training entry records (``gpu_ms``); where a launch has
none (a user's own Megatron-LM script), the mean of the training log's per-iteration times over the same
iterations (``log_ms``). A mean, not a median: the log's per-iteration times are host times whose jitter moves
time from one iteration to the next (the sum over the window is right, each part is not), so their mean cancels
the jitter a median keeps. Records written before this rule carry only ``median_ms`` (the log's median), which
is what they are compared on.
"""
from __future__ import annotations

import socket
import statistics
from dataclasses import dataclass, field

from tptune.confirm.megatron_log import as_dicts, error_lines, failure_kind, median_ms, parse_iterations


def free_port() -> int:
    """A TCP port nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mean_from(values: list[float], first: int) -> float | None:
    """The mean of ``values`` (entry i is iteration i+1) over iterations ``first`` on."""
    xs = [v for i, v in enumerate(values, start=1) if i >= first and v is not None]
    return round(statistics.fmean(xs), 3) if xs else None


@dataclass
class LaunchResult:
    setting: str
    round: int
    position: int
    status: str                       # "ok" | "failed"
    wall_s: float
    returncode: int | None
    log: str                          # the log's path, relative to the run folder when inside it
    iterations: list[dict] = field(default_factory=list)
    median_ms: float | None = None    # the log's median (kept for comparison with older records)
    log_ms: float | None = None       # the log's mean over the timed iterations
    gpu_ms: float | None = None       # the GPU-timed mean over the timed iterations
    iteration_ms: float | None = None  # what the ratios use: gpu_ms, else log_ms (module doc)
    sm_mhz: float | None = None       # rank 0's SM clock, median over the timed iterations
    timing: dict | None = None        # the entry's GPU-timed record as written
    failure: dict | None = None       # {"kind", "why", "lines"}
    key: str | None = None            # the stage's fingerprint this launch belongs to (confirm.store)

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("setting", "round", "position", "status", "wall_s", "returncode",
                                              "log", "median_ms", "log_ms", "gpu_ms", "iteration_ms", "sm_mhz",
                                              "failure", "key", "iterations", "timing")}


def launch_result(text: str, *, setting: str, round_: int, position: int, rc: int | None, timed_out: bool,
                  timeout_s: float, wall_s: float, log: str, iters: int, timed_from: int,
                  timing: dict | None = None, why_failed: str | None = None) -> LaunchResult:
    """The record of one finished launch from its log text and exit (``why_failed``: a reason found outside the
    log, e.g. the launch group died)."""
    its = parse_iterations(text)
    res = LaunchResult(setting, round_, position, "ok", round(wall_s, 2), rc, log, as_dicts(its),
                       median_ms(its, timed_from))
    res.log_ms = mean_from(_by_iteration(its), timed_from)
    if timing and timing.get("iteration_ms"):
        res.timing = timing
        res.gpu_ms = mean_from(timing["iteration_ms"], timed_from)
        mhz = [m for i, m in enumerate(timing.get("sm_mhz") or [], start=1) if i >= timed_from and m]
        res.sm_mhz = statistics.median(mhz) if mhz else None
    res.iteration_ms = res.gpu_ms if res.gpu_ms is not None else res.log_ms
    why = why_failed
    if why is None:
        if timed_out:
            why = f"hung: killed at the {timeout_s:g} s timeout after {len(its)} of {iters} iterations"
        elif rc != 0:
            why = f"exit status {rc} after {len(its)} of {iters} iterations"
        elif not any(i.iteration >= iters for i in its):
            why = f"exit status 0 but {len(its)} of {iters} iterations logged"
        elif res.iteration_ms is None:
            why = f"no iteration from {timed_from} on logged"
    if why:
        kind = "timeout" if timed_out else (failure_kind(text) or ("exit" if rc not in (0, None) else "incomplete"))
        res.status = "failed"
        res.failure = {"kind": kind, "why": why, "lines": error_lines(text)}
    return res


def _by_iteration(its) -> list[float | None]:
    """The log's times indexed by iteration (entry i is iteration i+1; a missing line is None)."""
    n = max((i.iteration for i in its), default=0)
    out: list[float | None] = [None] * n
    for i in its:
        out[i.iteration - 1] = i.ms
    return out
