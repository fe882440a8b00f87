"""Per (op, TP): the best setting of a TP-point session, its ties and finalists, its verdict, and the
ten-GEMM ub_cfgs a TP's picks make."""
from __future__ import annotations

import itertools
import statistics

import polars as pl

from tptune.cases import REFERENCE_KINDS, parse_case_id
from tptune.errors import TptuneError
from tptune.records.measured_point import METRIC, MeasuredPoint, TimingSummary
from tptune.records.sessions import Session
from tptune.search.steps import point_contenders, point_members
from tptune.settings.resolve import Settings
from tptune.stats.bound import bound_faults, burned_in, is_bound
from tptune.stats.host_evidence import summary as host_summary
from tptune.stats.noise import compare_points
from tptune.stats.pick import pick_best
from tptune.stats.pooled import pooled_ratio, run_pairs
from tptune.te import ubcfg
from tptune.trace.session_tables import case_summary
from tptune.trace.verdict import overlap_verdict


def _verdict(analysis: pl.DataFrame | None, best: MeasuredPoint | None, op: str, tp: int) -> tuple[str | None, str | None]:
    if best is None:
        return None, None
    if analysis is None:
        return None, "trace analysis missing"
    df = analysis
    frames = [df.filter(pl.col("case") == c) for c in (best.case, f"{op}-tp{tp}-none")]
    if any(f.height == 0 for f in frames):
        return None, "trace analysis missing"
    (mine, e1), (base, e2) = (case_summary(f) for f in frames)
    if mine is None or base is None:
        return None, e1 or e2
    return overlap_verdict(mine, base)


STEP_FACTOR = 2.0   # a batch whose halves' medians differ by more than STEP_FACTOR x the margin stepped


def batch_step(point: MeasuredPoint) -> float | None:
    """The largest level change inside one round's timed batch: |median(second half) / median(first
    half) - 1| over the rounds. A GPU time that moves between levels inside one batch (seen on x2 for
    qkv: 3.46 -> 3.82 ms within ten iterations; fc1 17.7 -> 20 ms after ~250 ms of load) moves the
    round's median with it. Halves, not max/min: a 500 ms window (timing.window_ms) holds a short
    power-management episode in nearly every batch, which its median rides out. Rounds are the
    consecutive runs of the samples, one batch each (``round_iters`` long where recorded)."""
    tot = point.timing.get(METRIC) or TimingSummary()
    samples, n = list(tot.samples or ()), len(tot.rounds or ())
    counts = tot.round_iters                 # absent in sessions recorded before windows: equal rounds
    if not counts:
        if not samples or not n or len(samples) % n:
            return None
        counts = [len(samples) // n] * n
    if not samples or sum(counts) != len(samples):
        return None
    steps = []
    for a, k in zip(itertools.accumulate(counts, initial=0), counts):
        if k < 2:
            continue
        first, second = statistics.median(samples[a:a + k // 2]), statistics.median(samples[a + k // 2:a + k])
        if first > 0:
            steps.append(abs(second / first - 1))
    return max(steps, default=None)


def tp_point(s: Settings, op: str, tp: int, results: list[dict], session: Session) -> dict:
    """The evidence of one (op, TP), all from one side-by-side session (``session``, the TP point's; its
    members from the searches' ``results``): the references, each search's winner and the tuned
    combinations; the best setting; the bound check; host-bound flags."""
    floor = s.decision.noise_floor
    members, tuned = point_members(s, op, tp, results)
    sess, runs = session.record, session.points
    missing = [c.id for c in members if c.id not in runs]
    if missing:
        raise TptuneError(f"{op} TP={tp}: the TP point would measure {', '.join(missing)}, which the recorded "
                          "session did not; re-measure this run")
    pts = {cid: burned_in(p.slim()) if is_bound(cid) else p.slim() for cid, p in runs.items()}
    stepped = sorted(c for c, p in runs.items() if p.status == "ok"
                     and (batch_step(p) or 0.0) > STEP_FACTOR * floor)
    refs = {parse_case_id(c).variant_id: pts[c] for c in pts
            if parse_case_id(c).variant.kind in REFERENCE_KINDS or "+" not in parse_case_id(c).variant_id}
    contenders = point_contenders(members)
    overlapped = {c: pts[c] for c in contenders if parse_case_id(c).variant.kind not in REFERENCE_KINDS}
    best, comparisons = pick_best(list(overlapped.values()), floor)
    if best is not None and best.median() == float("inf"):
        best = None
    ok = [p for p in overlapped.values() if p.median() != float("inf")]
    fastest = min(ok, key=MeasuredPoint.median) if ok else None
    verdict, reason = None, "not analysed yet"
    host_bound = sorted(c for c, p in pts.items() if p.host_bound)
    host_behind = sorted(c for c, p in pts.items() if p.status == "ok" and p.host_ahead is False)
    return {"op": op, "tp": tp, "session": sess["session"], "rounds": sess["rounds"], "stop": sess["stop"],
            "none": refs.get("none"), "nocomm": refs.get("nocomm"), "best": best,
            "fastest_overlapped": fastest, "tuned_cases": [c.id for c in tuned], "references": refs,
            "candidates": overlapped, "comparisons": comparisons, "verdict": verdict, "verdict_reason": reason,
            "bound_faults": bound_faults(pts, floor), "host_bound": host_bound, "host_behind": host_behind,
            "stepped": stepped, "canary": sess.get("canary"),
            "host_batches": {c: host_summary(runs[c]) for c in sorted(runs) if host_summary(runs[c])["batches"]},
            "searches": {r["dim"]: {"best_case": r["best_case"], "path": r.get("path"), "asked": r["asked"],
                                    "measured": r["measured"],
                                    **{k: r[k] for k in ("reference", "cost", "changes") if k in r}}
                         for r in results}}


def pooled_pairs(sessions: list[Session], winner: MeasuredPoint,
                 others: dict[str, MeasuredPoint | None]) -> dict:
    """winner / each named point pooled over every session of the run (``sessions``) that measured both
    (each session a block, stats.pooled); only where more than one session did. The bound's burn-in
    round is left out."""
    out = {}
    for name, other in others.items():
        if not other or other.case == winner.case:
            continue
        blocks = run_pairs(sessions, winner.case, other.case)
        if is_bound(other.case):
            blocks = [(n, a, {r: v for r, v in b.items() if r >= min(b) + 1}) for n, a, b in blocks if b]
        if len(blocks) > 1:
            pooled = pooled_ratio(blocks)
            if pooled is not None:
                out[name] = {"a": winner.case, "b": other.case, **pooled.to_dict()}
    return out


def knob_summary(search: dict) -> dict:
    """The knob search of one (op, TP) in short: where it started, its cost against the exhaustive
    grid, the knob groups that moved the op beyond the noise (the values changed, kept / incumbent)
    and the ones frozen (at the cheapest value that ties: the values, where that is not the incumbent's)."""
    changes = search.get("changes") or []
    return {"reference": search.get("reference"), "best_case": search["best_case"], "cost": search.get("cost"),
            "changed": [{"group": c["group"], "diff": c["diff"], "kept_ratio": c["kept_ratio"]}
                        for c in changes if c["moved"]],
            "frozen": [", ".join(c["diff"]) or f"{c['group']} {'+'.join(c['gemms'])}"
                       for c in changes if not c["moved"]]}


def tied_with(winner: MeasuredPoint, points: list[MeasuredPoint | None], floor: float) -> list[dict]:
    """The settings the winner does not beat beyond the noise (its interval against each), so a report
    can say which choices are ties: another run may pick any of them."""
    out = []
    for p in points:
        if not p or p is winner or p.case == winner.case or p.median() == float("inf"):
            continue
        cmp = compare_points(p, winner, floor=floor, tie="b")
        if cmp.outcome == 0:
            out.append({"case": p.case, **((cmp.ratio.to_dict()) if cmp.ratio else {}),
                        "resolved": cmp.resolved})
    return out


def with_verdict(point: dict, analysis: pl.DataFrame | None) -> dict:
    """The point with the trace verdict of its best setting from its session's trace ``analysis``
    (records.load.point_analysis; the point session is analysed after the GPU job that measured it, so
    point.json is written without it)."""
    if point.get("verdict") is None:
        point["verdict"], point["verdict_reason"] = _verdict(analysis, point.get("best"), point["op"], point["tp"])
    return point


def best_at(point: dict, floor: float) -> tuple[MeasuredPoint, MeasuredPoint | None, list]:
    """Fastest setting at one TP (no overlap included), the runner-up and the comparisons made."""
    candidates = [p for p in [point["none"], *point["candidates"].values()] if p]
    winner, comparisons = pick_best(candidates, floor)
    rest = [p for p in candidates if p is not winner and p.median() != float("inf")]
    return winner, (min(rest, key=MeasuredPoint.median) if rest else None), comparisons


def setting_of(case) -> dict:
    config = {"tp": case.tp, "case": case.id, "variant": case.variant_id}
    if case.variant.kind == "ub":
        config["ub_cfgs"] = ubcfg.op_entries(ubcfg.case_ub_cfgs(case, workload="fp8"), case.op)
    if case.variant.kind == "chunked":
        config["chunks"] = case.variant.chunks
    return config


def ub_cfgs_at(s: Settings, points_by_op: dict, tp: int, floor: float,
                fastest: bool = False) -> tuple[dict, list[str]]:
    """Ten-GEMM ub_cfgs for TP ``tp``: each op's chosen userbuffers setting there (``fastest``: its
    fastest by median, ties not given to the cheaper), else TE defaults."""
    per_op, notes = {}, []
    wl = s.model.workload.ub_rules
    for op, pts in points_by_op.items():
        if tp not in pts:
            notes.append(f"{op}: not measured at TP={tp}: TE defaults")
            continue
        if fastest:
            ok = [p for p in pts[tp]["candidates"].values() if p.median() != float("inf")
                  and parse_case_id(p.case).variant.kind == "ub"]
            if ok:
                best = min(ok, key=MeasuredPoint.median)
                per_op[op] = ubcfg.case_ub_cfgs(parse_case_id(best.case), workload=wl)
                notes.append(f"{op}: {best.case} ({best.median():.3f} ms fwd+bwd)")
            continue
        best = best_at(pts[tp], floor)[0]
        case = parse_case_id(best.case)
        if case.variant.kind != "ub":
            # Megatron overlaps every GEMM of the layer once tp_comm_overlap is on: an op whose fastest
            # setting is no overlap still needs a userbuffers entry, its fastest measured one.
            ub_best = pick_best(list(pts[tp]["candidates"].values()), floor)[0]
            if ub_best is None or ub_best.median() == float("inf"):
                notes.append(f"{op}: fastest at TP={tp} is {best.case} and no userbuffers setting of it was "
                             f"measured: TE defaults written")
                continue
            per_op[op] = ubcfg.case_ub_cfgs(parse_case_id(ub_best.case), workload=wl)
            notes.append(f"{op}: fastest at TP={tp} is {best.case}; Megatron overlaps every GEMM once overlap "
                         f"is on, so its fastest userbuffers setting is written: {ub_best.case} "
                         f"({ub_best.median():.3f} ms fwd+bwd)")
            continue
        per_op[op] = ubcfg.case_ub_cfgs(case, workload=wl)
        notes.append(f"{op}: {best.case} ({best.median():.3f} ms fwd+bwd)")
    if s.backend != "te":
        notes.append(f"{s.backend} backend run: no TE userbuffers were measured; entries are TE's defaults")
    return ubcfg.compose_ub_cfgs(per_op, workload=wl), notes
