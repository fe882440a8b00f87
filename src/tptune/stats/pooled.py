"""One pair measured in several sessions: the pooled ratio, each session a block.

Rounds pair a with b only inside a session. Pooled over sessions s = 1..k with n_s rounds each, the
per-round log ratios d_{s,r} give the estimate exp(mean of all d) (every round weighs alike) and a 95%
interval from the within-session spread (session as a block: each session's own level is taken out,
sd_w^2 = sum (d_{s,r} - mean_s)^2 / (n - k)), exp(mean +- t_{n-k} sd_w / sqrt(n)). With one session this is
the session's own paired interval. ``spread`` says how far the session means lie apart: when they differ
by more than their rounds explain (the largest |mean_s - mean| above t sd_w / sqrt(n_s)), ``heterogeneous``
is set and a report says so beside the figure.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from tptune.records.layer_result import LayerResult
from tptune.records.sessions import PooledWith, Session
from tptune.stats.rounds import log_ratio_interval, paired_log_ratios, point_rounds, t975


@dataclass
class Pooled:
    ratio: float
    lo: float | None
    hi: float | None
    rounds: int
    sessions: list = field(default_factory=list)   # [{"session", "ratio", "lo", "hi", "rounds"}]
    heterogeneous: bool = False

    def to_dict(self) -> dict:
        r = lambda x: None if x is None or not math.isfinite(x) else round(x, 5)   # noqa: E731
        return {"ratio": r(self.ratio), "lo": r(self.lo), "hi": r(self.hi), "rounds": self.rounds,
                "paired": True, "pooled_sessions": len(self.sessions), "heterogeneous": self.heterogeneous,
                "sessions": self.sessions}


def pooled_ratio(blocks: list[tuple[str, dict[int, float], dict[int, float]]]) -> Pooled | None:
    """[(session name, a's {round: ms}, b's {round: ms})] -> the pooled a/b; None without a round."""
    per = [(name, paired_log_ratios(a, b)) for name, a, b in blocks]
    per = [(name, ds) for name, ds in per if ds]
    if not per:
        return None
    alld = [x for _, ds in per for x in ds]
    n, k = len(alld), len(per)
    mean = statistics.fmean(alld)
    sessions = []
    for name, ds in per:
        r = log_ratio_interval(ds)
        sessions.append({"session": name, **r.to_dict()})
    if n - k < 1:
        return Pooled(math.exp(mean), None, None, n, sessions)
    ss = sum((x - statistics.fmean(ds)) ** 2 for _, ds in per for x in ds)
    sd = math.sqrt(ss / (n - k))
    half = t975(n - k) * sd / math.sqrt(n)
    het = k > 1 and any(abs(statistics.fmean(ds) - mean) > t975(n - k) * sd / math.sqrt(len(ds)) for _, ds in per)
    return Pooled(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n, sessions, het)


def session_blocks(pairs: list[tuple[str, Session | None, str, str]]) -> list[tuple[str, dict, dict]]:
    """[(name, recorded session, a's case, b's case)] -> pooled_ratio's blocks (a session that is not
    recorded, or lacks either case, is skipped)."""
    out = []
    for name, sess, a, b in pairs:
        if sess is None or a not in sess.points or b not in sess.points:
            continue
        out.append((name, point_rounds(sess.points[a]), point_rounds(sess.points[b])))
    return out


def run_pairs(sessions: list[Session], a: str, b: str) -> list[tuple[str, dict, dict]]:
    """Every session of a run that measured both ``a`` and ``b`` (search steps, TP points, the block)."""
    return session_blocks([(s.name, s, a, b) for s in sessions])


def block_pooled(layer_rec: LayerResult, own: Session | None,
                 pooled_with: tuple[list[PooledWith], list[dict]] | None) -> dict:
    """The block's tuned / each reference pooled over this run's block session ``own`` and the sessions
    named in the run's pooled_with.json (records.sessions.load_pooled_with: other runs of the same config,
    ``tptune verify`` of this run's file). A session whose file differs from this run's tuned preset is
    left out and named."""
    if pooled_with is None:
        return {}
    others, skipped = pooled_with
    tuned = layer_rec.tuned
    out = {}
    for row in layer_rec.settings:
        ref = row["case"]
        if ref == tuned:
            continue
        blocks = session_blocks([("this run", own, tuned, ref)] +
                                [(o.name, o.session, o.tuned, ref) for o in others])
        if len(blocks) > 1:
            p = pooled_ratio(blocks)
            if p is not None:
                out[row["variant"]] = p.to_dict()
    return {"pooled": out, "sessions": ["this run"] + [o.name for o in others],
            "checked_same_file": {o.name: o.same_file for o in others}, "skipped": skipped}
