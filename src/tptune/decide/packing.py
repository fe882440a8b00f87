"""The packing decision of a run (issue 53, docs/packing.md): its packed block sessions (search.packed) read into
packing.decide's values, decided, and packing.json's record. Values only: the caller reads the sessions and the
layer record and writes what this returns (emit.packing).

Per capacity T, its session's rounds give one T-token bin's time without overlap and with the written set, fwd+bwd
(run.json ``total_ms``) and forward-only (``fwd_only_ms``), and the no-overlap time at each native point. A round
id is made unique over the sessions (``ROUND_STRIDE`` x the session's index + its round), so packing.decide pairs
the capacity's times with the native fit of the same session's rounds only: every ratio is paired by round.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tptune.packing.decide import CapacityTimes, NativeTimes, PackingDecision, Plan, decide
from tptune.packing.rules import overshoot, summarize
from tptune.packing.spec import PackingSpec
from tptune.packing.ub_memory import GIB, ub_bytes
from tptune.records.sessions import Session
from tptune.search.packed import capacity_cases, native_cases
from tptune.stats.rounds import paired_ratio
from tptune.stats.wording import classify_ratio

ROUND_STRIDE = 1000
FWDBWD, FWD = "total_ms", "fwd_only_ms"


@dataclass(frozen=True)
class PackedRounds:
    """What the packed sessions measured, as packing.decide takes it, and what they could not."""
    times: dict[int, CapacityTimes]
    native: NativeTimes | None
    rows: list[dict]                # per capacity: the session, its rounds, the settings' ratios, numerics
    problems: list[str]             # members that failed or capacities left out, in words


def _rounds(point, metric: str, base: int) -> dict[int, float]:
    return {base + r: v for r, v in point.rounds(metric).items()} if point is not None else {}


def _iv(r) -> dict | None:
    return None if r is None else r.to_dict()


def read_rounds(sessions: dict[int, Session], tp: int, settings: dict, forward_passes: int,
                floor: float) -> PackedRounds:
    """The capacities' and the native points' times per round from the packed ``sessions`` ({T: session})."""
    times, fb_native, f_native, rows, problems = {}, {}, {}, [], []
    for i, cap in enumerate(sorted(sessions)):
        sess, base = sessions[cap], (i + 1) * ROUND_STRIDE
        pts = sess.points
        cases = capacity_cases(tp, cap, settings)
        none, tuned = pts.get(cases["none"].id), pts.get(cases["set"].id)
        preset = pts.get(cases["preset"].id) if "preset" in cases else None
        native = native_cases(tp, (sess.record.get("settings") or {}).get("packing", {}).get("native") or [])
        row = {"capacity": cap, "session": sess.name, "rounds": int(sess.record.get("rounds") or 0),
               "stop": sess.record.get("stop"), "set": cases["set"].variant_id,
               "preset": cases["preset"].variant_id if "preset" in cases else None}
        for name, p in (("none", none), ("set", tuned), ("preset", preset)):
            if p is not None:
                row[f"{name}_ms"] = _round(p.median(FWDBWD))
                row[f"{name}_fwd_only_ms"] = _round(p.median(FWD))
                row[f"{name}_numerics_ok"] = p.correct
        for label, a, b in (("set/none", tuned, none), ("preset/none", preset, none), ("set/preset", tuned, preset)):
            for metric, key in ((FWDBWD, label), (FWD, f"{label} forward-only")):
                r = paired_ratio(a.rounds(metric), b.rounds(metric)) if a is not None and b is not None else None
                row.setdefault("ratios", {})[key] = None if r is None else {
                    **r.to_dict(), "words": classify_ratio(r.to_dict(), floor)}
        rows.append(row)
        bad = [c.id for c in [*cases.values(), *native.values()]
               if not (pts.get(c.id) is not None and pts[c.id].ok)]
        if bad:
            problems.append(f"T = {cap}: not measured: {', '.join(bad)}")
        if none is None or tuned is None or not none.ok or not tuned.ok:
            problems.append(f"T = {cap} left out: no overlap or the set at T was not measured")
            continue
        if tuned.correct is False:     # the numerics rule of the layer stage: a failing setting is never the answer
            problems.append(f"T = {cap} left out: the set failed its numerics check on packed input "
                            f"({cases['set'].id})")
            continue
        times[cap] = CapacityTimes(cap, _rounds(none, FWDBWD, base), _rounds(tuned, FWDBWD, base),
                                   _rounds(none, FWD, base) if forward_passes else None,
                                   _rounds(tuned, FWD, base) if forward_passes else None)
        for tokens, case in native.items():
            p = pts.get(case.id)
            if p is None or not p.ok:
                continue
            for r, v in _rounds(p, FWDBWD, base).items():
                fb_native.setdefault(r, {})[tokens] = v
            for r, v in _rounds(p, FWD, base).items():
                f_native.setdefault(r, {})[tokens] = v
    counts = {len(v) for v in fb_native.values()}
    native = None
    if fb_native:
        degree = max(0, min(1, min(counts) - 1))
        native = NativeTimes(fb_native, f_native if forward_passes else None, degree)
    return PackedRounds(times, native, rows, problems)


def _round(x: float | None, nd: int = 4):
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def memory_headroom(memory: dict | None, tp: int) -> tuple[int | None, str | None]:
    """(bytes a GPU has left beyond the memory floor at ``tp``, in words), from decisions.json's meta.memory;
    (None, None) where the floor was not computed there."""
    rows = [r for r in ((memory or {}).get("table") or []) if r.get("tp") == tp and r.get("stage") in (None, "only")]
    if not rows or rows[0].get("usable") is None or rows[0].get("total") is None:
        return None, None
    r = rows[0]
    left = int(r["usable"] - r["total"])
    return left, (f"the memory floor at TP {tp} (the model's workload: weights, gradients, optimizer and "
                  f"activations) leaves {left / GIB:.2f} GiB of the {r['usable'] / GIB:.1f} GiB usable")


def packing_record(s, spec: PackingSpec, lengths: np.ndarray, plan: dict, sessions: dict[int, Session],
                   ub_cfgs: dict | None, memory: dict | None) -> tuple[dict, PackingDecision | None]:
    """packing.json's record (module doc) and the decision (None where nothing could be decided)."""
    base = {"tp": plan.get("tp"), "tp_why": plan.get("why"), "rule": spec.rule, "spec": spec.to_dict(),
            "capacities_planned": plan.get("capacities") or [], "settings": plan.get("settings")}
    tp = plan.get("tp")
    if not tp:
        return {**base, "verdict": "unmeasured", "capacity": None,
                "sentence": f"No packed block was measured: {plan.get('why')}."}, None
    w = s.model.workload
    settings = plan["settings"]
    rounds = read_rounds(sessions, tp, settings, spec.forward_passes, s.decision.noise_floor)
    native_steps = spec.native_steps(lengths, tp, w.is_fp8)
    native_plan = Plan.of(native_steps)
    fill = {cap: spec.fill_steps(lengths, cap) for cap in rounds.times}
    fill_plans = {cap: Plan.of(st) for cap, st in fill.items()}
    ub = {cap: ub_bytes(cap, s.model.model.hidden_size, tp, dtype_bytes=w.dtype_bytes, fp8=w.is_fp8,
                        ub_cfgs=ub_cfgs)
          for cap in plan["capacities"]}
    headroom, headroom_why = memory_headroom(memory, tp)
    nsum = summarize(native_steps)
    native_rec = {"rule": spec.rule, "micro_batches_per_step": round(nsum["micro_batches_per_step"], 3),
                  "real_per_step": round(nsum["real_per_step"], 1),
                  "padding_share": round(nsum["padding_share"], 5), "largest": nsum["largest_micro_batch"],
                  "over_budget_share": round(overshoot(native_steps, spec.max_token_len), 5),
                  "points": [{"tokens": t, "bin": k} for t, k in
                             ((sessions[min(sessions)].record.get("settings") or {}).get("packing", {})
                              .get("native") or [] if sessions else [])]}
    rec = {**base, "rows": rounds.rows, "problems": rounds.problems, "native": native_rec,
           "memory": {"headroom_bytes": headroom, "why": headroom_why,
                      "ub_bytes": {str(c): b for c, b in ub.items()},
                      "ub_gib": {str(c): round(b / GIB, 4) for c, b in ub.items()}}}
    if not rounds.times or rounds.native is None:
        why = "no capacity had both no overlap and the set measured" if not rounds.times else \
            "no native micro-batch was measured, so the native batching has no time"
        return {**rec, "verdict": "unmeasured", "capacity": None,
                "sentence": f"No packing answer: {why} ({'; '.join(rounds.problems) or 'see the sessions'})."}, None
    try:
        d = decide(native_plan, fill_plans, rounds.times, rounds.native, spec.forward_passes,
                   ub={c: ub[c] for c in rounds.times}, memory_headroom=headroom)
    except ValueError as exc:      # a round without the times a setup needs (packing.decide says which)
        return {**rec, "verdict": "unmeasured", "capacity": None,
                "sentence": f"No packing answer: {exc} ({'; '.join(rounds.problems) or 'see the sessions'})."}, None
    rec["native"]["fit"] = {"degree": rounds.native.degree, "residual": round(d.fit_residual, 5),
                            "outside": round(d.fit_outside, 5),
                            "tokens": sorted({t for pts in rounds.native.fwdbwd.values() for t in pts})}
    for row in rec["rows"]:
        fp = fill_plans.get(row["capacity"])
        if fp is not None:
            row["bins_per_step"] = round(fp.micro_batches, 3)
            row["padding_share"] = round(fp.padding_share, 5)
        row["ub_gib"] = round(ub[row["capacity"]] / GIB, 4)
    return {**rec, "verdict": d.verdict, "capacity": d.capacity, "sentence": d.sentence,
            "decision": d.to_dict()}, d
