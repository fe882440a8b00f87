"""Does a candidate overlap config really overlap? Compared with its
no-overlap baseline (same op and TP size), per seed-004 criteria."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from collections.abc import Mapping

import polars as pl

OVERLAPPED, NOT_OVERLAPPED, NO_COMM = "overlapped", "not overlapped", "no communication"


@dataclass(frozen=True)
class VerdictThresholds:
    max_gemm_ratio: float = 1.15  # (a) candidate GEMM time / baseline GEMM time
    max_comm_ratio: float = 1.30  # (b) candidate comm time / baseline comm time
    min_overlap_fraction: float = 0.30  # (c) overlapped comm / comm
    max_wall_ratio: float = 1.0  # (d) candidate wall must be below baseline wall * this
    min_comm_ms: float = 1e-3  # below this the candidate has "no communication"
    stat: str = "max"  # which over-ranks statistic of summarize() to use: "max" or "mean"


def _thresholds(t: VerdictThresholds | Mapping | None) -> VerdictThresholds:
    if t is None:
        return VerdictThresholds()
    if isinstance(t, VerdictThresholds):
        return t
    known = {f.name for f in fields(VerdictThresholds)}
    unknown = set(t) - known
    if unknown:
        raise ValueError(f"unknown verdict thresholds {sorted(unknown)}; known: {sorted(known)}")
    return VerdictThresholds(**{**asdict(VerdictThresholds()), **t})


def _totals(summary: pl.DataFrame, stat: str) -> dict[str, float]:
    """Sum of each metric over phases (forward + backward)."""
    cols = {m: f"{m}_ms_{stat}" for m in ("wall", "gemm", "comm", "overlap")}
    return {m: float(summary[c].fill_null(0).sum()) for m, c in cols.items()}


def overlap_verdict(
    candidate_summary: pl.DataFrame,
    baseline_summary: pl.DataFrame,
    thresholds: VerdictThresholds | Mapping | None = None,
) -> tuple[str, str]:
    """(verdict, reason) from summarize() outputs of a candidate and its baseline.

    Verdict is "overlapped" when all of (a) GEMM time, (b) comm time not much
    above baseline, (c) enough comm overlapped with GEMMs, (d) wall time below
    baseline hold; "no communication" when the candidate has no comm kernels.
    """
    t = _thresholds(thresholds)
    c, b = _totals(candidate_summary, t.stat), _totals(baseline_summary, t.stat)
    if c["comm"] < t.min_comm_ms:
        return NO_COMM, f"candidate has no communication kernels (comm {c['comm']:.3f} ms)"

    def ratio(x: float, y: float) -> float:
        return x / y if y > 0 else float("inf") if x > 0 else 1.0

    gemm_r, comm_r, wall_r = ratio(c["gemm"], b["gemm"]), ratio(c["comm"], b["comm"]), ratio(c["wall"], b["wall"])
    frac = c["overlap"] / c["comm"]
    checks = [
        (gemm_r <= t.max_gemm_ratio,
         f"(a) GEMM {c['gemm']:.3f} ms = {gemm_r:.2f}x baseline {b['gemm']:.3f} ms (limit {t.max_gemm_ratio:.2f}x)"),
        (comm_r <= t.max_comm_ratio,
         f"(b) comm {c['comm']:.3f} ms = {comm_r:.2f}x baseline {b['comm']:.3f} ms (limit {t.max_comm_ratio:.2f}x)"),
        (frac >= t.min_overlap_fraction,
         f"(c) overlapped comm {c['overlap']:.3f} of {c['comm']:.3f} ms = {frac:.1%} (need {t.min_overlap_fraction:.0%})"),
        (wall_r < t.max_wall_ratio,
         f"(d) wall {c['wall']:.3f} ms = {wall_r:.2f}x baseline {b['wall']:.3f} ms (need < {t.max_wall_ratio:.2f}x)"),
    ]
    failed = [msg for ok, msg in checks if not ok]
    if failed:
        return NOT_OVERLAPPED, "failed: " + "; ".join(failed)
    return OVERLAPPED, "all criteria met: " + "; ".join(msg for _, msg in checks)
