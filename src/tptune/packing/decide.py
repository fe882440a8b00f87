"""Does TP overlap pay after the padding to T? The expected step time per real token of three setups.

(a) ``native``: the framework's own batching (veRL or slime's micro-batches, their own padding), no overlap;
(b) ``fill``: fill-to-capacity bins padded to T, no overlap (b / a - 1 is what the padding costs);
(c) ``overlap``: the same bins with the tuned overlap (1 - c / b is what overlap saves at T).

Each is one step's expected time: the fwd+bwd of its micro-batches plus ``forward_passes`` forward-only
passes over the same micro-batches (veRL's log-prob and reference passes; TE keeps them on the userbuffers
fprop path, so they need T too). A fill step runs its bins, each one T-token micro-batch measured on the GPU
(``CapacityTimes``: per round, one bin's time without overlap and with the tuned overlap, fwd+bwd and
forward-only); a native step runs micro-batches of varying token counts, whose no-overlap time comes from a fit
of time against token count measured at a few counts in the same rounds (``NativeTimes``; a polynomial of
``degree``, 1 by default, fitted per round; ``fit_residual`` says how well it holds). The setups train the same
sequences step by step (rules.pack_steps with one seed), so their times per real token compare as their step
times do.

Intervals: per round r the three step times a_r, b_r, c_r are computed from that round's measurements, and
each ratio is ``stats.rounds.paired_ratio`` over the rounds (the native points and the bins measured in one
session's rounds), or ``unpaired_ratio`` where the native fit was measured in other rounds.

The decision (``decide``): among the capacities (those whose userbuffers fit ``memory_headroom`` where it is
given), the one with the lowest c / a, preferring one whose interval lies below 1. Overlap is on when c / a's
interval lies below 1, off when it lies above, undecided when it straddles 1; ``sentence`` says it in one line.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from tptune.packing.rules import Step
from tptune.packing.ub_memory import GIB
from tptune.stats.rounds import Ratio, paired_ratio, unpaired_ratio


@dataclass(frozen=True)
class CapacityTimes:
    """One capacity T measured: one T-token bin's time (ms) per round, {round id: ms}, without overlap
    (``*_none``) and with the tuned overlap (``*_tuned``), fwd+bwd and forward-only (the forward-only pair may
    be None where the run has no forward-only pass: ``forward_passes`` 0)."""
    capacity: int
    fwdbwd_none: dict[int, float]
    fwdbwd_tuned: dict[int, float]
    fwd_none: dict[int, float] | None = None
    fwd_tuned: dict[int, float] | None = None


@dataclass(frozen=True)
class NativeTimes:
    """No-overlap time (ms) of one micro-batch at a few token counts, per round: {round id: {tokens: ms}},
    fwd+bwd and forward-only; fitted per round by a polynomial of ``degree`` in the token count."""
    fwdbwd: dict[int, dict[int, float]]
    fwd: dict[int, dict[int, float]] | None = None
    degree: int = 1


@dataclass(frozen=True)
class Plan:
    """What the packing gives per step, averaged over the drawn steps: ``moments[d]`` the mean over steps of
    the sum over its micro-batches of tokens**d (moments[0]: micro-batches per step), ``real`` the real tokens,
    ``padded`` the tokens computed on, ``tokens`` every micro-batch's token count (for the fit's range)."""
    rule: str
    moments: tuple[float, ...]
    real: float
    padded: float
    tokens: np.ndarray = field(repr=False, compare=False)
    capacity: int | None = None

    @property
    def micro_batches(self) -> float:
        return self.moments[0]

    @property
    def padding_share(self) -> float:
        return (self.padded - self.real) / self.padded if self.padded else 0.0

    @classmethod
    def of(cls, steps: Iterable[Step], degree: int = 2) -> "Plan":
        steps = list(steps)
        if not steps:
            raise ValueError("no steps")
        tokens = np.array([mb.padded for s in steps for mb in s.micro_batches], dtype=np.float64)
        moments = tuple(float((tokens ** d).sum()) / len(steps) for d in range(degree + 1))
        return cls(steps[0].rule, moments, sum(s.real for s in steps) / len(steps), float(tokens.sum()) / len(steps),
                   tokens, steps[0].capacity)


@dataclass(frozen=True)
class CapacityResult:
    """One capacity's expected step times (mean over rounds, ms), its ratios with intervals and its costs."""
    capacity: int
    bins_per_step: float
    padding_share: float            # padding's share of the tokens a fill step computes on
    ub_bytes: int | None            # the userbuffers' bytes per GPU at T (ub_memory)
    step_ms: dict[str, float]       # native, fill, overlap
    vs_native: Ratio                # c / a: the answer
    padding_cost: Ratio             # b / a
    overlap: Ratio                  # c / b
    fits_memory: bool = True

    def to_dict(self) -> dict:
        return {"capacity": self.capacity, "bins_per_step": round(self.bins_per_step, 3),
                "padding_share": round(self.padding_share, 5), "ub_bytes": self.ub_bytes,
                "ub_gib": None if self.ub_bytes is None else round(self.ub_bytes / GIB, 3),
                "step_ms": {k: round(v, 4) for k, v in self.step_ms.items()},
                "vs_native": self.vs_native.to_dict(), "padding_cost": self.padding_cost.to_dict(),
                "overlap": self.overlap.to_dict(), "fits_memory": self.fits_memory}


@dataclass(frozen=True)
class PackingDecision:
    verdict: str                    # on | off | undecided
    capacity: int                   # the T the verdict is about
    native_rule: str
    forward_passes: int
    real_per_step: float
    results: tuple[CapacityResult, ...]
    fit_residual: float             # the native fit's largest |fit - measured| / measured over its points
    fit_outside: float              # share of native micro-batches outside the token counts the fit measured
    sentence: str

    @property
    def chosen(self) -> CapacityResult:
        return next(r for r in self.results if r.capacity == self.capacity)

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "capacity": self.capacity, "native_rule": self.native_rule,
                "forward_passes": self.forward_passes, "real_per_step": round(self.real_per_step, 2),
                "fit_residual": round(self.fit_residual, 5), "fit_outside": round(self.fit_outside, 5),
                "sentence": self.sentence, "capacities": [r.to_dict() for r in self.results]}


# --- the native fit ------------------------------------------------------------------------------------------

def fit_rounds(points: dict[int, dict[int, float]], degree: int = 1) -> dict[int, np.ndarray]:
    """Per round, the polynomial coefficients (lowest degree first) of ms against tokens. ValueError for a
    round with fewer distinct token counts than degree + 1."""
    out = {}
    for r, pts in points.items():
        if len(pts) < degree + 1:
            raise ValueError(f"round {r}: {len(pts)} token counts measured, a degree-{degree} fit needs "
                             f"{degree + 1}")
        x = np.array(sorted(pts), dtype=np.float64)
        y = np.array([pts[int(t)] for t in x], dtype=np.float64)
        out[r] = np.polynomial.polynomial.polyfit(x, y, degree)
    return out


def fit_residual(points: dict[int, dict[int, float]], coeffs: dict[int, np.ndarray]) -> float:
    """The largest relative gap between a round's fit and its measured points."""
    worst = 0.0
    for r, pts in points.items():
        for t, ms in pts.items():
            worst = max(worst, abs(float(np.polynomial.polynomial.polyval(t, coeffs[r])) - ms) / ms)
    return worst


def _native_round_ms(coeffs: dict[int, np.ndarray], plan: Plan) -> dict[int, float]:
    out = {}
    for r, c in coeffs.items():
        if len(c) > len(plan.moments):
            raise ValueError(f"the plan holds moments up to degree {len(plan.moments) - 1}, the fit is degree "
                             f"{len(c) - 1}")
        out[r] = float(sum(c[d] * plan.moments[d] for d in range(len(c))))
    return out


# --- the decision ---------------------------------------------------------------------------------------------

def step_rounds(times: CapacityTimes, bins: float, forward_passes: int) -> tuple[dict[int, float], dict[int, float]]:
    """Per round, a fill step's ms without overlap and with the tuned overlap: bins x (fwd+bwd +
    forward_passes x forward-only)."""
    def per_round(fb: dict[int, float], f: dict[int, float] | None) -> dict[int, float]:
        if forward_passes and f is None:
            raise ValueError(f"T={times.capacity}: {forward_passes} forward-only pass(es) a step, no forward-only time")
        rounds = set(fb) & set(f) if forward_passes else set(fb)
        return {r: bins * (fb[r] + (forward_passes * f[r] if forward_passes else 0.0)) for r in sorted(rounds)}
    return per_round(times.fwdbwd_none, times.fwd_none), per_round(times.fwdbwd_tuned, times.fwd_tuned)


def _ratio(a: dict[int, float], b: dict[int, float]) -> Ratio:
    """a / b, paired by round where they share rounds, else unpaired (stats.rounds)."""
    r = paired_ratio(a, b) if set(a) & set(b) else unpaired_ratio(list(a.values()), list(b.values()))
    if r is None:
        raise ValueError("no rounds to compare")
    return r


def evaluate(native_plan: Plan, fill_plans: dict[int, Plan], times: dict[int, CapacityTimes], native: NativeTimes,
             forward_passes: int, ub: dict[int, int] | None = None,
             memory_headroom: int | None = None) -> tuple[list[CapacityResult], float, float]:
    """Every capacity's CapacityResult, the native fit's largest relative residual and the share of native
    micro-batches outside the measured token counts."""
    fb_coeffs = fit_rounds(native.fwdbwd, native.degree)
    native_rounds = _native_round_ms(fb_coeffs, native_plan)
    residual = fit_residual(native.fwdbwd, fb_coeffs)
    measured = sorted({t for pts in native.fwdbwd.values() for t in pts})
    if forward_passes:
        if native.fwd is None:
            raise ValueError(f"{forward_passes} forward-only pass(es) a step, and no native forward-only times")
        f_coeffs = fit_rounds(native.fwd, native.degree)
        residual = max(residual, fit_residual(native.fwd, f_coeffs))
        f_rounds = _native_round_ms(f_coeffs, native_plan)
        native_rounds = {r: native_rounds[r] + forward_passes * f_rounds[r] for r in native_rounds if r in f_rounds}
    tokens = native_plan.tokens
    outside = float(((tokens < measured[0]) | (tokens > measured[-1])).mean()) if tokens.size else 0.0
    results = []
    for cap in sorted(times):
        plan = fill_plans[cap]
        none, tuned = step_rounds(times[cap], plan.micro_batches, forward_passes)
        b = ub.get(cap) if ub else None
        results.append(CapacityResult(
            capacity=cap, bins_per_step=plan.micro_batches, padding_share=plan.padding_share, ub_bytes=b,
            step_ms={"native": _mean(native_rounds), "fill": _mean(none), "overlap": _mean(tuned)},
            vs_native=_ratio(tuned, native_rounds), padding_cost=_ratio(none, native_rounds),
            overlap=_ratio(tuned, none),
            fits_memory=memory_headroom is None or b is None or b <= memory_headroom))
    return results, residual, outside


def decide(native_plan: Plan, fill_plans: dict[int, Plan], times: dict[int, CapacityTimes], native: NativeTimes,
           forward_passes: int, ub: dict[int, int] | None = None,
           memory_headroom: int | None = None) -> PackingDecision:
    """The decision (module doc) over the measured capacities."""
    if not times:
        raise ValueError("no capacity measured")
    results, residual, outside = evaluate(native_plan, fill_plans, times, native, forward_passes, ub, memory_headroom)
    pool = [r for r in results if r.fits_memory] or results
    clear = [r for r in pool if r.vs_native.hi < 1]
    best = min(clear or pool, key=lambda r: (r.vs_native.ratio, r.capacity))
    v = best.vs_native
    verdict = "on" if v.hi < 1 else ("off" if v.lo > 1 else "undecided")
    return PackingDecision(verdict, best.capacity, native_plan.rule, forward_passes, native_plan.real, tuple(results),
                           residual, outside, sentence(verdict, best, native_plan.rule))


def sentence(verdict: str, r: CapacityResult, native_rule: str) -> str:
    """The one-sentence answer for the report's first screen."""
    v, pc, ov = r.vs_native, r.padding_cost, r.overlap
    gib = "" if r.ub_bytes is None else f", +{r.ub_bytes / GIB:.2f} GiB of userbuffers per GPU"
    pad = f"padding {100 * r.padding_share:.1f}% of the tokens"
    if verdict == "on":
        return (f"Use T = {r.capacity}, fill-to-capacity packing, overlap on: a step {_pct(1 - v.ratio)} faster "
                f"[{_pct(1 - v.hi)}, {_pct(1 - v.lo)}] than {native_rule}'s batching without overlap, {pad}{gib}.")
    if verdict == "off":
        return (f"Keep overlap off: padding to T = {r.capacity} costs {_pct(pc.ratio - 1)} "
                f"[{_pct(pc.lo - 1)}, {_pct(pc.hi - 1)}] of the step ({pad}) and overlap saves {_pct(1 - ov.ratio)} "
                f"[{_pct(1 - ov.hi)}, {_pct(1 - ov.lo)}]: the step with it is {_pct(v.ratio - 1)} slower "
                f"[{_pct(v.lo - 1)}, {_pct(v.hi - 1)}] than {native_rule}'s batching without overlap.")
    return (f"Undecided: at T = {r.capacity} fill-to-capacity with overlap takes {v.ratio:.3f} [{v.lo:.3f}, "
            f"{v.hi:.3f}] of {native_rule}'s step without overlap, an interval that straddles 1 (padding costs "
            f"{_pct(pc.ratio - 1)}, overlap saves {_pct(1 - ov.ratio)}); more rounds would decide it.")


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if math.isfinite(x) else "n/a"


def _mean(d: dict[int, float]) -> float:
    return float(np.mean(list(d.values()))) if d else float("nan")
