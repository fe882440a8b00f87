"""The TP decision: per op, TP step by TP step, and for the model (the four ops summed), with the memory floor."""
from __future__ import annotations


from tptune.decide.tp_point import best_at
from tptune.errors import TptuneError
from tptune.model.memory import gpu_memory_bytes, tp_floor
from tptune.records.measured_point import METRIC, MeasuredPoint, make_point
from tptune.records.point_fields import point_median
from tptune.search import tp_decision
from tptune.settings.resolve import Settings
from tptune.stats.rounds import point_rounds


def _tp_rules(s: Settings) -> dict:
    d = s.decision
    return {"start_tp": s.tp_sizes[0], "gpus_per_node": s.gpus_per_node,
            "allowed_tps": s.tp_sizes, "tolerance": d.tp_tolerance, "floor": d.noise_floor,
            "trust_verdict": d.trust_verdict,
            "min_hidden_fraction": tp_decision.DEFAULT_MIN_HIDDEN_FRACTION if d.min_hidden_fraction is None
            else d.min_hidden_fraction}


def tp_floor_for(s: Settings, *, recorded_gib: float | None = None) -> dict:
    """model.memory.tp_floor for this run (its model, tp_sizes, parallel, hardware, gpus_per_node and
    decision.min_tp)."""
    node = s.gpus_per_node
    mem = gpu_memory_bytes(s.hardware.as_dict(), s.device, recorded_gib=recorded_gib, ranks_per_host=node)
    return tp_floor(s.model, s.tp_sizes, s.parallel.as_dict(), mem, node, s.decision.min_tp)


def _tp_points(points: dict[int, dict]) -> dict[int, tp_decision.TpPoints]:
    """Whether *any* overlap setting hides the communication: the fastest overlapped point is
    judged (still against the noise margin of the no-overlap point)."""
    return {tp: tp_decision.TpPoints(best=p.get("fastest_overlapped", p["best"]), none=p["none"],
                                     nocomm=p["nocomm"], verdict=p["verdict"])
            for tp, p in points.items()}


def memory_floor(s: Settings, recorded_gib: float | None) -> dict:
    """The memory floor of this run (tptune.model.memory.tp_floor), with the GPU memory recorded by its
    sessions (records.sessions.recorded_gpu_memory) when the machine deciding has no GPU; ``effective_tp``
    is the TP the decisions may not go below: the floor, or when nothing in the node fits, the TP of the
    smallest layout that fits."""
    f = tp_floor_for(s, recorded_gib=recorded_gib)
    f["effective_tp"] = f["floor_tp"] or (f.get("smallest_layout") or {}).get("tp")
    return f


def settle_undecided(rule_tp: int, evidence: list[dict], efficiency: dict, floor: dict,
                     scaling: tuple[int, list[dict]] | None = None) -> int:
    """The model's overlap rule states its interval. It is undecided where either of its two tests has an
    interval across its line, whatever side the point estimate lies on: the share of the exposed
    communication the ops hide (``efficiency``, the ops summed, each capped at its bound: the report's
    figure) across min_hidden_fraction while the ops beat no overlap; or the ops' time / no overlap across
    the margin (faster, perhaps beyond it: 0.970 [0.954, 0.986] against 2%) while the share is not below
    the line. Then, in this order: the next TP's scaling decides where it was measured and passed
    (``scaling``: model_scaling's chain from the start TP, or the rule's own where it went on); else the
    memory floor where it needs the start TP or more (apply_floor raises the TP); else the cheaper layout,
    no TP, is kept, as a tie keeps the cheaper setting, and the record says that more rounds
    (timing.max_rounds) would decide it. The hiding record is marked ``undecided`` with ``decided_by``; the
    TP returned is the rule's, before the memory floor."""
    hide = next((e for e in evidence if e.get("rule") == "hides_communication"), None)
    lo, hi = efficiency.get("lo"), efficiency.get("hi")
    if hide is None or hide.get("hidden_fraction") is None or lo is None or hi is None or efficiency.get("fault"):
        return rule_tp     # no fraction to judge: decided as it was
    need = hide["min_hidden_fraction"]
    cmp = hide.get("comparison") or {}
    r, margin = cmp.get("ratio") or {}, hide.get("margin") or 0.0
    beats = cmp.get("outcome", 0) < 0
    across_margin = (cmp.get("outcome") == 0 and not cmp.get("resolved") and r.get("lo") is not None
                     and r.get("hi") is not None and r["lo"] < 1 - margin < r["hi"])
    if beats and lo < need <= hi:
        why = f"its interval straddles {need:.0%}"
    elif across_margin and hi >= need:
        why = (f"the ops summed read {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] of no overlap ({r.get('rounds')} "
               f"rounds), across the {margin:.0%} margin")
    else:
        return rule_tp
    start = hide["tp"]
    chain = [e for e in evidence if e.get("rule") == "scaling" and e.get("from_tp") == start]
    scaled_tp = rule_tp
    if not chain and scaling is not None:
        scaled_tp, steps = scaling
        chain = [e for e in steps if e.get("rule") == "scaling" and e.get("from_tp") == start]
        if chain and chain[0].get("passed"):
            evidence.extend({**e, "after_undecided": True} for e in steps)
    floor_tp = floor.get("effective_tp")
    if chain and chain[0].get("passed"):
        decided_by, tp = "scaling", scaled_tp
        then = f"TP {start} → {2 * start} scaled within the tolerance, so that decides"
    elif floor_tp and floor_tp >= start:
        decided_by, then, tp = "memory_floor", "the memory floor decides", 1
    else:
        decided_by, tp = "cheaper", 1
        then = ("the cheaper layout, no TP, is kept (more rounds, timing.max_rounds, would decide it; a run "
                "with the TP files can still use them)")
    hide.update({"passed": None, "undecided": True, "decided_by": decided_by, "rule_tp": tp,
                 "undecided_why": f": {why}, so the overlap rule is undecided; {then}"})
    return tp


def apply_floor(chosen: int, floor: dict, what: str) -> tuple[int, dict | None]:
    ft = floor.get("effective_tp")
    if not ft or chosen >= ft:
        return chosen, ({"rule": "memory_floor", "floor_tp": ft, "passed": True, "why": floor["why"]}
                        if ft and ft > 1 else None)
    return ft, {"rule": "memory_floor", "floor_tp": ft, "rule_tp": chosen, "passed": False,
                "reason": f"{what} TP={chosen} cannot hold the model: {floor['why']}; raised to TP={ft}",
                "measured": ft in floor.get("measured_tps", [ft])}


def unmeasured(point: dict | None) -> str | None:
    """Why a TP point has nothing to judge (no overlapped setting measured), or None when it has."""
    if point is None:
        return "no TP point recorded"
    if point.get("fastest_overlapped", point.get("best")) is not None:
        return None
    errors = sorted({f"{c}: {(p.error_kind if p is not None else None) or 'failed'}"
                     for c, p in (point.get("candidates") or {}).items()})
    return (f"none of its {len(errors)} overlapped settings was measured ({'; '.join(errors)})" if errors
            else "it had no overlapped setting to measure")


def _stop_failed(s: Settings, op: str, tp: int, points: dict[int, dict], why: str) -> dict:
    """The chain ends at a TP point with nothing measured: the TP rule over the TPs before it (no TP when
    it is the first), and the failure named; the run ends non-zero (records.run_status)."""
    before = {t: p for t, p in points.items() if t < tp}
    chosen, evidence = 1, []
    if before:
        rules = dict(_tp_rules(s), allowed_tps=sorted(before))
        chosen, evidence = tp_decision.tp_result(op, _tp_points(before), **rules)
    failure = f"{op} TP={tp} TP point: {why}"
    evidence.append({"rule": "measured", "op": op, "tp": tp, "passed": False, "reason": failure})
    return {"op": op, "tp": tp, "next": None, "measured_tps": sorted(points), "failed": failure,
            "rule_tp": chosen, "chosen_tp": chosen, "evidence": evidence}


def tp_step(s: Settings, op: str, tp: int, points: dict[int, dict], floor: dict | None = None) -> dict:
    """The next TP to measure for ``op``, or its chosen TP; ``floor``: the run's memory floor
    (memory_floor), none checked without it."""
    why = unmeasured(points.get(tp))
    if why is not None:
        return _stop_failed(s, op, tp, points, why)
    measured = _tp_points(points)
    nxt = tp_decision.tp_next(op, measured, **_tp_rules(s))
    if s.decision.explore_all_tps:  # evidence runs: every TP, the rule decides after
        later = [t for t in s.tp_sizes if t > tp]
        nxt = later[0] if later else None
    floor = floor or {}
    ft = floor.get("effective_tp")
    if nxt is None and ft and ft > max(points):  # measure up to the floor: the answer cannot be below it
        later = [t for t in s.tp_sizes if max(points) < t <= ft]
        nxt = later[0] if later else None
    if nxt is not None and nxt <= tp:
        raise TptuneError(f"{op} TP={tp}: the TP decision asks for TP={nxt} next, not above TP={tp}")
    rec = {"op": op, "tp": tp, "next": nxt, "measured_tps": sorted(points)}
    if nxt is None:
        chosen, evidence = tp_decision.tp_result(op, measured, **_tp_rules(s))
        floored, ev = apply_floor(chosen, {**floor, "measured_tps": sorted(points)}, op) if floor else (chosen, None)
        rec.update({"rule_tp": chosen, "chosen_tp": floored, "evidence": evidence + ([ev] if ev else [])})
    return rec


def _summed(points_by_op: dict[str, dict[int, dict]], tp: int, which: str, floor: float) -> MeasuredPoint:
    """A point whose time is the sum over ops (for the model-level TP rule). Its rounds are sums of the
    ops' rounds, round k of each op's point session (the rounds in which that op's none, bound and
    fastest setting were all measured), so the sums of two references stay paired round by round and
    the interval of their ratio carries every op's round-to-round noise."""
    chosen, total = [], 0.0
    for pts in points_by_op.values():
        p = pts[tp]
        if which == "fastest" and unmeasured(p):   # no overlapped setting: the sum has none to judge
            return make_point(f"all-tp{tp}-{which}", status="failed")
        fastest = best_at(p, floor)[0]
        q = fastest if which == "fastest" else p.get(which)
        t = point_median(q)
        if t == float("inf"):  # a failed reference: the sum cannot be judged (the rule says so)
            return make_point(f"all-tp{tp}-{which}", status="failed")
        total += t
        refs = [fastest, p.get("none"), p.get("nocomm")]
        common = sorted(set.intersection(*(set(point_rounds(r)) for r in refs if r))) if all(refs) else []
        chosen.append((q, common))
    point = make_point(f"all-tp{tp}-{which}", [total])
    n = min((len(c) for _, c in chosen), default=0)
    if n >= 2:
        sums = [sum(point_rounds(q)[c[k]] for q, c in chosen) for k in range(n)]
        tot = point.timing[METRIC].with_(rounds=tuple(sums), round_ids=tuple(range(n)), median=total)
        point = point.with_(timing={METRIC: tot}, session=f"sum-tp{tp}")
    return point


def _model_points(s: Settings, points_by_op: dict[str, dict[int, dict]]) -> tuple[list[int], dict]:
    """The TP sizes measured for every op, and at each the ops summed (none, bound, each op's pick)."""
    floor = s.decision.noise_floor
    common = sorted(set.intersection(*(set(p) for p in points_by_op.values()))) if points_by_op else []
    return common, {tp: tp_decision.TpPoints(best=_summed(points_by_op, tp, "fastest", floor),
                                             none=_summed(points_by_op, tp, "none", floor),
                                             nocomm=_summed(points_by_op, tp, "nocomm", floor)) for tp in common}


def model_tp(s: Settings, points_by_op: dict[str, dict[int, dict]]) -> tuple[int, list[dict]]:
    """One TP for the whole model (Megatron has one): the per-op TP rule applied to the sum of the
    ops' times, over the TP sizes measured for every op."""
    common, measured = _model_points(s, points_by_op)
    if not measured:
        return 1, []
    rules = dict(_tp_rules(s), allowed_tps=common, start_tp=common[0], trust_verdict=False)
    nxt = tp_decision.tp_next("model", measured, **rules)
    if nxt is not None:  # the rule wants a TP not measured for every op: stop at what we have
        rules["allowed_tps"] = [t for t in common if t < nxt] or common[:1]
    chosen, evidence = tp_decision.tp_result("model", measured, **rules)
    return chosen, evidence


def model_scaling(s: Settings, points_by_op: dict[str, dict[int, dict]]) -> tuple[int, list[dict]] | None:
    """The model's scaling steps from its start TP as if that TP had passed (tp_decision.scaling_chain), over
    the TP sizes measured for every op: (the TP they reach, their evidence), or None where no next TP was
    measured. settle_undecided reads it when the start TP's hiding test is undecided."""
    common, measured = _model_points(s, points_by_op)
    if len(common) < 2:
        return None
    rules = _tp_rules(s)
    _, chosen, chain = tp_decision.scaling_chain("model", measured, common[0], gpus_per_node=rules["gpus_per_node"],
                                                 allowed_tps=common, tolerance=rules["tolerance"])
    if chosen is None or not any(e.get("rule") == "scaling" for e in chain):
        return None
    return chosen, chain
