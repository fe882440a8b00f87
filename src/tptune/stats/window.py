"""A round's timed iterations, cut by GPU time: what a shorter window, a longer pre-roll or a time bin
would have timed. The window calibration (cli.calibrate), benchmarks/window_length.py and the quoted
calibration figures (report.figure_window) read a recorded round through these alone.

A recorded round is its timed iterations in order (ms each, GPU time): the first W ms of it are exactly what
a W ms window would have timed, after the same build, pre-roll and hold.
"""
from __future__ import annotations

import math
import statistics


def split_rounds(samples: list[float], round_iters: list[int]) -> list[list[float]]:
    """A run's per-iteration samples (all rounds, in order) cut into its rounds."""
    if sum(round_iters) != len(samples):
        raise ValueError(f"{len(samples)} samples do not add up to the rounds' {sum(round_iters)} iterations")
    out, i = [], 0
    for n in round_iters:
        out.append(samples[i:i + n])
        i += n
    return out


def call_batches(call: dict) -> list[list[float]]:
    """A benchmarks/measure_noise.py call's timed iterations (iterations_ms, in order) cut into its batches."""
    its, out, i = call["iterations_ms"], [], 0
    for b in call["batches"]:
        n = b.get("iters") or 0
        out.append(its[i:i + n])
        i += n
    if i != len(its) or not all(out):
        raise ValueError(f"call {call.get('call')}: its batches' iterations do not add up to its {len(its)}")
    return out


def window_value(iterations: list[float], window_ms: float, min_iters: int, skip_ms: float = 0.0) -> float:
    """The round value a window of ``window_ms`` would have given after ``skip_ms`` more pre-roll: the
    median of the iterations that start at or after ``skip_ms`` of GPU time and fit in the window (at
    least ``min_iters``, as timing.timed_iters keeps ``iters``)."""
    start, done = 0, 0.0
    while start < len(iterations) - 1 and done < skip_ms:
        done += iterations[start]
        start += 1
    rest = iterations[start:]
    k, total = 0, 0.0
    for t in rest:
        if k >= min_iters and total + t > window_ms:
            break
        total += t
        k += 1
    return statistics.median(rest[:max(k, 1)])


def round_values(rounds: list[list[float]], window_ms: float, min_iters: int, skip_ms: float = 0.0) -> list[float]:
    """window_value of each recorded round, in round order."""
    return [window_value(r, window_ms, min_iters, skip_ms) for r in rounds]


def spread(values: list[float]) -> float:
    """max / min - 1 of a member's round values: how far its level moved from round to round."""
    return max(values) / min(values) - 1


def time_bins(iterations: list[float], bin_ms: float) -> list[list[float]]:
    """The round's iterations grouped by the bin of ``bin_ms`` their start falls in (GPU time from the
    window's start); a bin no iteration starts in (one iteration longer than a bin) is left out."""
    bins: dict[int, list[float]] = {}
    t = 0.0
    for x in iterations:
        bins.setdefault(int(t // bin_ms), []).append(x)
        t += x
    return [bins[k] for k in sorted(bins)]


def bin_profile(rounds: list[list[float]], bin_ms: float, n_bins: int) -> list[float]:
    """A member's mean iteration time in each of its first ``n_bins`` time bins, relative to its first bin
    (the mean over its rounds of each bin's mean, over the same of the first bin, less 1); ValueError when
    a round holds fewer bins."""
    means = []
    for i, r in enumerate(rounds):
        bins = time_bins(r, bin_ms)
        if len(bins) < n_bins:
            raise ValueError(f"round {i} holds {len(bins)} bins of {bin_ms:g} ms, fewer than {n_bins}")
        means.append([statistics.fmean(b) for b in bins[:n_bins]])
    level = [statistics.fmean(m[k] for m in means) for k in range(n_bins)]
    return [x / level[0] - 1 for x in level]


def largest_step(iterations: list[float], bin_ms: float) -> float | None:
    """The largest step between consecutive time bins' medians of one round, |later / earlier - 1|; None
    for a round of one bin."""
    med = [statistics.median(b) for b in time_bins(iterations, bin_ms)]
    steps = [abs(b / a - 1) for a, b in zip(med, med[1:])]
    return max(steps) if steps else None


def first_member_effect(first: dict[int, float], second: dict[int, float]) -> float | None:
    """What round 0 adds to the log ratio first / second: its round-0 value less the mean over their later
    common rounds (None under 3 common rounds or without round 0). ``first`` is the member that ran first in
    round 0, on a card that had been idle or ran another op."""
    common = sorted(set(first) & set(second))
    if len(common) < 3 or common[0] != 0:
        return None
    d = [math.log(first[r]) - math.log(second[r]) for r in common]
    return d[0] - statistics.fmean(d[1:])
