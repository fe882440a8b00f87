"""How noisy were a run's sessions, and could their round budget resolve the margins at that noise?

A session decides by the per-round log ratios of its members, paired by round (search.rounds). The
spread of those log ratios is the machine's noise as the decisions meet it: builds, the card's clock
episodes inside a timed window, drift between the members of one round. The drift canary cannot see
it: it re-measures one reference at session starts, and a card can hold its level over a run while
its rounds scatter. On one H100 (results/noise-h100) a null pair's per-round sd was 3.0% with the
default 500 ms window, against 1.2-1.4% on the H200s, while its level stayed put.

Per op (steps, TP points and layer sessions alike), this pools the sd of the per-round log ratio of
every contender against its session's leader over their common rounds:
    sd = sqrt(sum(df_i * sd_i^2) / sum(df_i)),  df_i = common rounds - 1
(pairs that share a leader are not independent: the pooled sd is a fair figure, its df an upper bound),
and the typical sd, the same scale from the median absolute residual (robust_sd), which one bad round
cannot lift. The warning goes by the typical sd.

What that noise allows: a contender that ties the leader exactly resolves as a tie within the margin m
by B rounds only while its interval's half-width t(B-1) * sd / sqrt(B) <= ln(1 + m), i.e.
    sd <= resolvable_sd(m, B) = ln(1 + m) * sqrt(B) / t(B-1)      (1.89% for m = 2%, B = 6).
Above it, ties end undecided (the cheaper setting wins them) and a setting wins only by more than
about m plus that half-width; the report says so at the top.
"""
from __future__ import annotations

import math
import statistics

from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import Session
from tptune.stats.rounds import paired_log_ratios as pair_log_ratios
from tptune.stats.rounds import point_rounds, t975


def session_pairs(rec: dict, runs: dict[str, MeasuredPoint]) -> list[list[float]]:
    """The per-round log ratios of each contender against the session's leader (pairs with two or more
    common rounds; failed members have no rounds and drop out)."""
    leader = rec.get("leader")
    lead = point_rounds(runs.get(leader)) if leader else {}
    if not lead:
        return []
    out = []
    for cid in rec.get("contenders") or []:
        if cid == leader:
            continue
        ds = pair_log_ratios(point_rounds(runs.get(cid)), lead)
        if len(ds) >= 2:
            out.append(ds)
    return out


def pooled_sd(pairs: list[list[float]]) -> tuple[float | None, int]:
    """(pooled sd of the pairs' log ratios, its degrees of freedom); (None, 0) without two rounds."""
    ss = sum(statistics.variance(ds) * (len(ds) - 1) for ds in pairs if len(ds) >= 2)
    df = sum(len(ds) - 1 for ds in pairs if len(ds) >= 2)
    return (math.sqrt(ss / df), df) if df else (None, 0)


def robust_sd(pairs: list[list[float]]) -> float | None:
    """The typical round-to-round spread, outlier rounds aside: 1.4826 x the median absolute residual of
    every pair's log ratios about their own mean, each scaled by sqrt(n / (n - 1)) so that its variance
    is the per-round one (a normal scale, as the pooled sd, that one bad round of one pair cannot lift)."""
    res = []
    for ds in pairs:
        n = len(ds)
        if n >= 2:
            m, k = statistics.fmean(ds), math.sqrt(n / (n - 1))
            res += [abs(d - m) * k for d in ds]
    return 1.4826 * statistics.median(res) if res else None


def resolvable_sd(margin: float, rounds: int) -> float:
    """The largest per-round sd at which a tie sitting at 1.00 clears ``margin`` by ``rounds`` rounds."""
    if rounds < 2:
        return 0.0
    return math.log1p(margin) * math.sqrt(rounds) / t975(rounds - 1)


def op_noise(sessions: list[Session]) -> dict[str, dict]:
    """{op: {sd, df, typical_sd, pairs, sessions, max_rounds}} over every recorded session of the run
    (module doc; records.sessions.load_sessions)."""
    by_op: dict[str, dict] = {}
    for sess in sessions:
        if not sess.complete:
            continue   # a session whose members were not all kept
        pairs = session_pairs(sess.record, sess.points)
        if not pairs:
            continue
        d = by_op.setdefault(sess.op, {"pairs": [], "sessions": 0, "max_rounds": 0})
        d["pairs"] += pairs
        d["sessions"] += 1
        d["max_rounds"] = max(d["max_rounds"], int(sess.record.get("max_rounds") or 0))
    out = {}
    for op, d in sorted(by_op.items()):
        sd, df = pooled_sd(d["pairs"])
        out[op] = {"sd": sd, "df": df, "typical_sd": robust_sd(d["pairs"]), "pairs": len(d["pairs"]),
                   "sessions": d["sessions"], "max_rounds": d["max_rounds"]}
    return out


def noise_limits(noise: dict[str, dict], margin: float) -> dict[str, float]:
    """{op: resolvable sd} at each op's round budget."""
    return {op: resolvable_sd(margin, n["max_rounds"]) for op, n in noise.items()}


def noise_warning(noise: dict[str, dict], margin: float, device: str = "cuda") -> str | None:
    """The report's top line when some op's sessions were typically noisier than their round budget can
    resolve at ``margin`` (module doc); None otherwise. The typical sd decides, not the pooled one: a
    single bad round (a host that fell behind, a clock episode) widens its own pair's interval, which
    says so, and not every decision of the op. ``device``: what the remedy names (cuda | cpu)."""
    limits = noise_limits(noise, margin)
    over = [op for op, n in noise.items() if n.get("typical_sd") is not None and n["typical_sd"] > limits[op]]
    if not over:
        return None
    worst = max(over, key=lambda op: noise[op]["typical_sd"] / limits[op])
    n = noise[worst]
    half = t975(n["max_rounds"] - 1) * n["typical_sd"] / math.sqrt(n["max_rounds"])
    each = ", ".join(f"{op} {noise[op]['typical_sd']:.1%}" for op in over)
    return (f"session noise: the per-round ratios inside sessions typically spread more than the round budget "
            f"can resolve ({each}: the sd of a per-round log ratio, outlier rounds aside; with "
            f"{n['max_rounds']} rounds a tie resolves within the {margin:.0%} margin only up to "
            f"{limits[worst]:.1%}). There a tie stays undecided (the cheaper setting is kept), and a setting "
            f"of {worst} wins only by more than about {margin + half:.1%} (the margin plus the half-width of a "
            f"{n['max_rounds']}-round interval at that sd). " + _remedy(device))


def _remedy(device: str) -> str:
    if device == "cpu":
        return ("On CPU a round is the wall-clock time of a shared host: more timed iterations (timing.iters) "
                "or rounds (timing.max_rounds) narrow it.")
    return ("A longer timed window (timing.window_ms) narrows it where the card's clock moves in episodes "
            "(results/noise-h100, one H100: 3.0% at 500 ms, 1.4% at 1000 ms): timing.window_ms: auto calibrates "
            "it on the node before measuring (or `tptune calibrate-window <run config>` once, for an overlay); "
            "timing.max_rounds buys rounds.")
