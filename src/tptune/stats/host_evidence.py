"""Host-ahead evidence of timed batches, the same for an op's batch and a block's.

A batch counts as GPU time when the host stayed ahead of the GPU (worker.timing, step 5), by either
check: ``lead`` (the host finished enqueueing before the GPU left the hold) or ``queue`` (CUDA's launch
queue held the enqueue back: the host entered the timed iterations before the GPU reached them, the
probe says GPU-bound, and no timed mark found the GPU idle). Each batch records the figures behind its
verdict (evidence()), so a reader can redo it; a batch that fails both is measured again up to
max_attempts times, and one that still fails is kept, flagged and counted (summary()): its round's
figure includes host time, and the report warns, for block sessions as for op sessions.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tptune.records.measured_point import MeasuredPoint

EVIDENCE_KEYS = ("entered_ms", "slept_ms", "enqueue_ms", "idle_marks")


def evidence(rank_batches: list[dict]) -> dict:
    """The figures behind one round's verdict, worst rank: host launch time against GPU time (the
    probe's, agreed over ranks), when the host entered the timed iterations and finished enqueueing
    against the hold, and the timed marks that found the GPU idle."""
    last = [(b.get("attempts") or [{}])[-1] for b in rank_batches]
    ev = {"host_probe_ms": max((b.get("host_agreed_ms") or b.get("host_ms") or 0.0) for b in rank_batches),
          "gpu_probe_ms": max((b.get("gpu_probe_ms") or 0.0) for b in rank_batches)}
    for k in ("entered_ms", "enqueue_ms", "idle_marks"):
        vals = [a.get(k) for a in last if a.get(k) is not None]
        ev[k] = max(vals) if vals else None
    slept = [a.get("slept_ms") for a in last if a.get("slept_ms") is not None]
    ev["slept_ms"] = min(slept) if slept else None
    ev["gpu_idle_seen"] = None if ev["idle_marks"] is None else ev["idle_marks"] > 0
    return ev


def complete(batch: dict) -> bool:
    """Whether a recorded batch carries the figures of its verdict (batches recorded before this kept only
    the verdict for the queue check)."""
    if batch.get("timing") != "gpu_host_ahead":
        return True
    if batch.get("check") == "lead":
        return batch.get("enqueue_ms") is not None and batch.get("slept_ms") is not None
    return all(k in (batch.get("evidence") or {}) for k in EVIDENCE_KEYS)


def summary(point: MeasuredPoint | None) -> dict:
    """{batches, failed, attempts, by_check, unproven}: of one point's batches, those whose host fell
    behind after every attempt, the attempts spent, the verdicts by check, and the host-ahead batches whose
    recorded figures cannot show it (a queue verdict recorded without its evidence)."""
    bs = [] if point is None else point.host_batches
    gpu = [b for b in bs if b.get("timing") == "gpu_host_ahead"]
    by = {}
    for b in gpu:
        c = b.get("check") or ("failed" if b.get("host_ahead") is False else "unknown")
        by[c] = by.get(c, 0) + 1
    return {"batches": len(gpu), "failed": sum(1 for b in gpu if b.get("host_ahead") is False),
            "attempts": sum(b.get("attempts") or 1 for b in gpu), "by_check": by,
            "unproven": sum(1 for b in gpu if b.get("host_ahead") is not False and not complete(b))}


def behind_rounds(point: MeasuredPoint | None) -> list[int]:
    """Rounds whose batch never got the host ahead."""
    bs = [] if point is None else point.host_batches
    return [b.get("round") for b in bs if b.get("timing") == "gpu_host_ahead" and b.get("host_ahead") is False]
