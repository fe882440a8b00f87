"""From measured points to answers: the best setting per (op, TP), the TP decision, the final configs."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from .cases import REFERENCE_KINDS, parse_case_id
from .ops import op_gemms
from .search import emit, session_noise, tp_decision, ubcfg
from .search.noise import compare_points, cost_key
from .figures.bound import burned_in, is_bound
from .figures.efficiency import Efficiency, model_efficiency, op_efficiency
from .figures.finalists import finalists
from .figures.host import summary as host_summary
from .figures.pooled import pooled_ratio, run_pairs
from .search.points import point_median
from .settings import Settings
from .workflow import point_contenders, point_members, read_session, session_dir


def _read(p: Path) -> dict:
    return json.loads(Path(p).read_text())


def slim(point: dict | None) -> dict | None:
    """What decisions need of a run.json: case, session, status, timing stats, host figures."""
    if point is None:
        return None
    timing = {k: {f: v for f, v in st.items() if f != "samples"} if isinstance(st, dict) else st
              for k, st in (point.get("timing") or {}).items()}
    return {"case": point["case"], "status": point["status"], "session": point.get("session"),
            "timing": timing, "host": {k: v for k, v in (point.get("host") or {}).items() if k != "batches"},
            "clock": point.get("clock"), "error": point.get("error")}


def pick_best(points: list[dict], floor: float) -> tuple[dict | None, list[dict]]:
    """The pick among measured points: the leader is the fastest (by median); every other point is
    compared with it, and the pick is the cheapest point that the leader does not beat beyond the
    noise and that no other point beats either (the leader itself when it beats all). A point beaten
    by any setting is out even where its comparison with the leader is undecided: a session drops a
    member once some setting beats it, so it may share too few rounds with the leader to lose to it
    (on x2, no overlap lost to one qkv setting by 1.059 [1.043, 1.076] and was undecided against the
    leader by median, 0.953 [0.909, 0.998] over its 3 rounds). The pick does not depend on the order
    of the comparisons (ties are not transitive)."""
    ok = [p for p in points if point_median(p) != float("inf")]
    if not ok:
        ordered = sorted(points, key=lambda p: cost_key(p["case"]))
        return (ordered[0] if ordered else None), []
    leader = min(ok, key=lambda p: (point_median(p), cost_key(p["case"])))
    tied, comparisons = [leader], []
    for p in sorted(points, key=lambda p: cost_key(p["case"])):
        if p is leader:
            continue
        cmp = compare_points(leader, p, floor=floor, tie="a")
        comparisons.append(cmp.to_dict())
        if cmp.outcome == 0 and not _beaten(p, ok, floor, comparisons):
            tied.append(p)
    return min(tied, key=lambda p: cost_key(p["case"])), comparisons


def _beaten(p: dict, others: list[dict], floor: float, comparisons: list) -> bool:
    """Whether some other point beats ``p`` beyond the noise (that comparison is recorded)."""
    for q in others:
        if q is p or q["case"] == p["case"]:
            continue
        cmp = compare_points(q, p, floor=floor, tie="a")
        if cmp.outcome < 0:   # q faster beyond the noise
            comparisons.append(cmp.to_dict())
            return True
    return False


def _verdict(run_dir: Path, best: dict | None, op: str, tp: int) -> tuple[str | None, str | None]:
    from .analyze import case_summary
    from .trace import overlap_verdict

    if best is None:
        return None, None
    path = run_dir / "analysis" / op / f"tp{tp}" / "point.parquet"
    if not path.exists():
        return None, "trace analysis missing"
    df = pl.read_parquet(path)
    frames = [df.filter(pl.col("case") == c) for c in (best["case"], f"{op}-tp{tp}-none")]
    if any(f.height == 0 for f in frames):
        return None, "trace analysis missing"
    (mine, e1), (base, e2) = (case_summary(f) for f in frames)
    if mine is None or base is None:
        return None, e1 or e2
    return overlap_verdict(mine, base)


def bound_faults(points: dict[str, dict], floor: float = 0.02) -> list[dict]:
    """The bound-fault test (figures.bound): the bound slower than a setting beside it, by the paired
    rounds the efficiency uses."""
    from .figures.bound import bound_faults as faults

    return faults(points, floor)


STEP_FACTOR = 2.0   # a batch whose halves' medians differ by more than STEP_FACTOR x the margin stepped


def batch_step(point: dict) -> float | None:
    """The largest level change inside one round's timed batch: |median(second half) / median(first
    half) - 1| over the rounds. A GPU time that moves between levels inside one batch (seen on x2 for
    qkv: 3.46 -> 3.82 ms within ten iterations; fc1 17.7 -> 20 ms after ~250 ms of load) moves the
    round's median with it. Halves, not max/min: a 500 ms window (timing.window_ms) holds a short
    power-management episode in nearly every batch, which its median rides out. Rounds are the
    consecutive runs of the samples, one batch each (``round_iters`` long where recorded)."""
    import itertools
    import statistics

    tot = (point.get("timing") or {}).get("total_ms") or {}
    samples, n = tot.get("samples") or [], len(tot.get("rounds") or [])
    counts = tot.get("round_iters")          # absent in sessions recorded before windows: equal rounds
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


def tp_point(s: Settings, op: str, tp: int, run_dir: Path) -> dict:
    """The evidence of one (op, TP), all from one side-by-side session: the references, each search's
    winner and the tuned combinations; the best setting; the bound check; host-bound flags."""
    floor = s.config["decision"]["noise_floor"]
    results = _read(run_dir / "search" / op / f"tp{tp}" / "results.json")
    members, tuned = point_members(s, op, tp, results)
    sess, runs = read_session(run_dir, str(session_dir(Path("."), op, tp, "point")))
    missing = [c.id for c in members if c.id not in runs]
    if missing:
        from .errors import TptuneError
        raise TptuneError(f"{op} TP={tp}: the TP point would measure {', '.join(missing)}, which the recorded "
                          "session did not; re-measure this run")
    pts = {cid: burned_in(slim(p)) if is_bound(cid) else slim(p) for cid, p in runs.items()}
    stepped = sorted(c for c, p in runs.items() if p["status"] == "ok"
                     and (batch_step(p) or 0.0) > STEP_FACTOR * floor)
    refs = {parse_case_id(c).variant_id: pts[c] for c in pts
            if parse_case_id(c).variant.kind in REFERENCE_KINDS or "+" not in parse_case_id(c).variant_id}
    contenders = point_contenders(members)
    overlapped = {c: pts[c] for c in contenders if parse_case_id(c).variant.kind not in REFERENCE_KINDS}
    best, comparisons = pick_best(list(overlapped.values()), floor)
    if best is not None and point_median(best) == float("inf"):
        best = None
    ok = [p for p in overlapped.values() if point_median(p) != float("inf")]
    fastest = min(ok, key=point_median) if ok else None
    verdict, reason = None, "not analysed yet"
    host_bound = sorted(c for c, p in pts.items() if (p.get("host") or {}).get("host_bound"))
    host_behind = sorted(c for c, p in pts.items() if p["status"] == "ok" and
                         (p.get("host") or {}).get("host_ahead") is False)
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


def _tp_rules(s: Settings) -> dict:
    d = s.config["decision"]
    return {"start_tp": s.tp_sizes[0], "gpus_per_node": s.config.get("gpus_per_node", 8),
            "allowed_tps": s.tp_sizes, "tolerance": d["tp_tolerance"], "floor": d["noise_floor"],
            "trust_verdict": d.get("trust_verdict", False),
            "min_hidden_fraction": d.get("min_hidden_fraction", tp_decision.DEFAULT_MIN_HIDDEN_FRACTION)}


def _tp_points(points: dict[int, dict]) -> dict[int, tp_decision.TpPoints]:
    """Whether *any* overlap setting hides the communication: the fastest overlapped point is
    judged (still against the noise margin of the no-overlap point)."""
    return {tp: tp_decision.TpPoints(best=p.get("fastest_overlapped", p["best"]), none=p["none"],
                                     nocomm=p["nocomm"], verdict=p["verdict"])
            for tp, p in points.items()}


def memory_floor(s: Settings, run_dir: Path) -> dict:
    """The memory floor of this run (tptune.memory.tp_floor), with the GPU memory recorded by its
    sessions when the machine deciding has no GPU; ``effective_tp`` is the TP the decisions may not go
    below: the floor, or when nothing in the node fits, the TP of the smallest layout that fits."""
    from .memory import tp_floor_for

    recorded = None
    for p in sorted(Path(run_dir).glob("sessions/*/tp*/point/*/run.json"))[:1]:
        recorded = (json.loads(p.read_text()).get("environment") or {}).get("gpu_memory_gib")
    f = tp_floor_for(s, recorded_gib=recorded)
    f["effective_tp"] = f["floor_tp"] or (f.get("smallest_layout") or {}).get("tp")
    return f


def _apply_floor(chosen: int, floor: dict, what: str) -> tuple[int, dict | None]:
    ft = floor.get("effective_tp")
    if not ft or chosen >= ft:
        return chosen, ({"rule": "memory_floor", "floor_tp": ft, "passed": True, "why": floor["why"]}
                        if ft and ft > 1 else None)
    return ft, {"rule": "memory_floor", "floor_tp": ft, "rule_tp": chosen, "passed": False,
                "reason": f"{what} TP={chosen} cannot hold the model: {floor['why']}; raised to TP={ft}",
                "measured": ft in floor.get("measured_tps", [ft])}


def tp_step(s: Settings, op: str, tp: int, points: dict[int, dict], run_dir: Path | None = None) -> dict:
    measured = _tp_points(points)
    nxt = tp_decision.tp_next(op, measured, **_tp_rules(s))
    if s.config["decision"].get("explore_all_tps"):  # evidence runs: every TP, the rule decides after
        later = [t for t in s.tp_sizes if t > tp]
        nxt = later[0] if later else None
    floor = memory_floor(s, run_dir) if run_dir is not None else {}
    ft = floor.get("effective_tp")
    if nxt is None and ft and ft > max(points):  # measure up to the floor: the answer cannot be below it
        later = [t for t in s.tp_sizes if max(points) < t <= ft]
        nxt = later[0] if later else None
    rec = {"op": op, "tp": tp, "next": nxt, "measured_tps": sorted(points)}
    if nxt is None:
        chosen, evidence = tp_decision.tp_result(op, measured, **_tp_rules(s))
        floored, ev = _apply_floor(chosen, {**floor, "measured_tps": sorted(points)}, op) if floor else (chosen, None)
        rec.update({"rule_tp": chosen, "chosen_tp": floored, "evidence": evidence + ([ev] if ev else [])})
    return rec


def _op_choice(s: Settings, op: str, final: dict, run_dir: Path) -> dict:
    """Chosen TP and setting of one op, with runner-up and evidence. TP=1 (no tensor parallelism)
    has no setting of its own: its evidence is the start TP's points, where no setting hid enough."""
    floor = s.config["decision"]["noise_floor"]
    points = _points(run_dir, op, final["measured_tps"])
    chosen = final["chosen_tp"]
    at = points.get(chosen) or points[max((t for t in points if t <= chosen), default=min(points))]
    winner, runner_up, comparisons = _best_at(at, floor)
    case = parse_case_id(winner["case"])
    if chosen == 1:
        config = {"tp": 1, "case": None, "variant": "no TP",
                  "note": f"no overlap setting hid the communication at TP={case.tp}; "
                          f"fastest there: {winner['case']}"}
    else:
        config = _setting(case)
    rec = emit.decisions_record(op, tp=chosen, config=config, winner=winner, runner_up=runner_up,
                                tp_evidence=final.get("evidence", []), comparisons=comparisons,
                                searches={f"tp{tp}/{d}": v.get("path") or [] for tp, p in points.items()
                                          for d, v in p["searches"].items()}, floor=floor)
    rec["session"] = at.get("session")
    rec["rounds"] = at.get("rounds")
    knobs = {str(tp): knob_summary(p["searches"]["knobs"]) for tp, p in points.items() if "knobs" in p["searches"]}
    if knobs:
        rec["knob_search"] = knobs
    rec["vs_none"] = (compare_points(winner, at["none"], floor=floor, tie="b").to_dict()
                      if at.get("none") and winner is not at["none"] else None)
    rec["ties"] = tied_with(winner, [at["none"], *at["candidates"].values()], floor)
    rec["finalists"] = finalists(winner, [p for p in [at["none"], *at["candidates"].values()] if p])
    rec["efficiency"] = op_efficiency(at.get("none"), winner, at.get("nocomm")).to_dict()
    rec["pooled"] = pooled_pairs(run_dir, winner, {"none": at.get("none"), "runner_up": runner_up,
                                                   "bound": at.get("nocomm")})
    rec["points"] = {str(tp): {"none": p["none"], "nocomm": p["nocomm"], "best": p["best"],
                               "verdict": p["verdict"], "verdict_reason": p["verdict_reason"],
                               "fastest": _best_at(p, floor)[0]}
                     for tp, p in points.items()}
    return rec


def pooled_pairs(run_dir: Path, winner: dict, others: dict[str, dict | None]) -> dict:
    """winner / each named point pooled over every session of the run that measured both (each session
    a block, figures.pooled); only where more than one session did. The bound's burn-in round is left out."""
    out = {}
    for name, other in others.items():
        if not other or other["case"] == winner["case"]:
            continue
        blocks = run_pairs(run_dir, winner["case"], other["case"])
        if is_bound(other["case"]):
            blocks = [(n, a, {r: v for r, v in b.items() if r >= min(b) + 1}) for n, a, b in blocks if b]
        if len(blocks) > 1:
            pooled = pooled_ratio(blocks)
            if pooled is not None:
                out[name] = {"a": winner["case"], "b": other["case"], **pooled.to_dict()}
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


def tied_with(winner: dict, points: list[dict | None], floor: float) -> list[dict]:
    """The settings the winner does not beat beyond the noise (its interval against each), so a report
    can say which choices are ties: another run may pick any of them."""
    out = []
    for p in points:
        if not p or p is winner or p["case"] == winner["case"] or point_median(p) == float("inf"):
            continue
        cmp = compare_points(p, winner, floor=floor, tie="b")
        if cmp.outcome == 0:
            out.append({"case": p["case"], **((cmp.ratio.to_dict()) if cmp.ratio else {}),
                        "resolved": cmp.resolved})
    return out


def _points(run_dir: Path, op: str, tps) -> dict[int, dict]:
    return {tp: with_verdict(run_dir, _read(run_dir / "search" / op / f"tp{tp}" / "point.json")) for tp in tps}


def with_verdict(run_dir: Path, point: dict) -> dict:
    """The point with the trace verdict of its best setting (the point session is analysed after the
    GPU job that measured it, so point.json is written without it)."""
    if point.get("verdict") is None:
        point["verdict"], point["verdict_reason"] = _verdict(run_dir, point.get("best"), point["op"], point["tp"])
    return point


def _best_at(point: dict, floor: float) -> tuple[dict, dict | None, list]:
    """Fastest setting at one TP (no overlap included), the runner-up and the comparisons made."""
    candidates = [p for p in [point["none"], *point["candidates"].values()] if p]
    winner, comparisons = pick_best(candidates, floor)
    rest = [p for p in candidates if p is not winner and point_median(p) != float("inf")]
    return winner, (min(rest, key=point_median) if rest else None), comparisons


def _setting(case) -> dict:
    config = {"tp": case.tp, "case": case.id, "variant": case.variant_id}
    if case.variant.kind == "ub":
        config["ub_cfgs"] = ubcfg.op_entries(ubcfg.case_ub_cfgs(case, workload="fp8"), case.op)
    if case.variant.kind == "chunked":
        config["chunks"] = case.variant.chunks
    return config


def _summed(points_by_op: dict[str, dict[int, dict]], tp: int, which: str, floor: float) -> dict | None:
    """A point whose time is the sum over ops (for the model-level TP rule). Its rounds are sums of the
    ops' rounds, round k of each op's point session (the rounds in which that op's none, bound and
    fastest setting were all measured), so the sums of two references stay paired round by round and
    the interval of their ratio carries every op's round-to-round noise."""
    from .search.points import make_point
    from .search.rounds import point_rounds

    chosen, total = [], 0.0
    for pts in points_by_op.values():
        p = pts[tp]
        fastest = _best_at(p, floor)[0]
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
        point["timing"]["total_ms"].update({"rounds": sums, "round_ids": list(range(n)), "median": total})
        point["session"] = f"sum-tp{tp}"
    return point


def model_tp(s: Settings, points_by_op: dict[str, dict[int, dict]]) -> tuple[int, list[dict]]:
    """One TP for the whole model (Megatron has one): the per-op TP rule applied to the sum of the
    ops' times, over the TP sizes measured for every op."""
    floor = s.config["decision"]["noise_floor"]
    common = sorted(set.intersection(*(set(p) for p in points_by_op.values()))) if points_by_op else []
    measured = {}
    for tp in common:
        measured[tp] = tp_decision.TpPoints(best=_summed(points_by_op, tp, "fastest", floor),
                                            none=_summed(points_by_op, tp, "none", floor),
                                            nocomm=_summed(points_by_op, tp, "nocomm", floor))
    if not measured:
        return 1, []
    rules = dict(_tp_rules(s), allowed_tps=common, start_tp=common[0], trust_verdict=False)
    nxt = tp_decision.tp_next("model", measured, **rules)
    if nxt is not None:  # the rule wants a TP not measured for every op: stop at what we have
        rules["allowed_tps"] = [t for t in common if t < nxt] or common[:1]
    chosen, evidence = tp_decision.tp_result("model", measured, **rules)
    return chosen, evidence


def _ub_cfgs_at(s: Settings, points_by_op: dict, tp: int, floor: float,
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
            ok = [p for p in pts[tp]["candidates"].values() if point_median(p) != float("inf")
                  and parse_case_id(p["case"]).variant.kind == "ub"]
            if ok:
                best = min(ok, key=point_median)
                per_op[op] = ubcfg.case_ub_cfgs(parse_case_id(best["case"]), workload=wl)
                notes.append(f"{op}: {best['case']} ({point_median(best):.3f} ms fwd+bwd)")
            continue
        best = _best_at(pts[tp], floor)[0]
        case = parse_case_id(best["case"])
        if case.variant.kind != "ub":
            # Megatron overlaps every GEMM of the layer once tp_comm_overlap is on: an op whose fastest
            # setting is no overlap still needs a userbuffers entry, its fastest measured one.
            ub_best = pick_best(list(pts[tp]["candidates"].values()), floor)[0]
            if ub_best is not None and point_median(ub_best) != float("inf"):
                notes.append(f"{op}: fastest at TP={tp} is {best['case']}; Megatron overlaps every GEMM once "
                             f"overlap is on, so its fastest userbuffers setting is written: {ub_best['case']}")
                best, case = ub_best, parse_case_id(ub_best["case"])
        if case.variant.kind == "ub":
            per_op[op] = ubcfg.case_ub_cfgs(case, workload=wl)
            notes.append(f"{op}: {best['case']} ({point_median(best):.3f} ms fwd+bwd)")
        else:
            notes.append(f"{op}: fastest at TP={tp} is {best['case']}: TE defaults written")
    if s.backend != "te":
        notes.append(f"{s.backend} backend run: no TE userbuffers were measured; entries are TE's defaults")
    return ubcfg.compose_ub_cfgs(per_op, workload=wl), notes


def decide(s: Settings, run_dir: Path, final_files: list[Path]) -> dict:
    floor = s.config["decision"]["noise_floor"]
    records, points_by_op = {}, {}
    for f in final_files:
        final = _read(f)
        records[final["op"]] = _op_choice(s, final["op"], final, run_dir)
        points_by_op[final["op"]] = _points(run_dir, final["op"], final["measured_tps"])
    rule_tp, tp_evidence = model_tp(s, points_by_op)
    mem = memory_floor(s, run_dir)
    all_tps = sorted({t for pts in points_by_op.values() for t in pts})
    tp, ev = _apply_floor(rule_tp, {**mem, "measured_tps": all_tps}, "model")
    if ev:
        tp_evidence = tp_evidence + [ev]
    m, w = s.model.model, s.model.workload
    meta = {"model": m.name, "workload": {"seq_length": w.seq_length, "micro_batch_size": w.micro_batch_size,
                                          "dtype": w.dtype, **({"recipe": w.recipe} if w.is_fp8 else {})},
            "precision": w.precision_label,
            "backend": s.backend, "device": s.device, "model_tp": tp, "model_tp_rule": rule_tp,
            "model_tp_evidence": tp_evidence, "memory": mem,
            "noise_floor": floor, "tp_tolerance": s.config["decision"]["tp_tolerance"],
            "measurement": measurement_summary(run_dir, points_by_op, floor, s.device)}
    meta["model_efficiency"] = _model_efficiency(records, points_by_op)
    for e in tp_evidence:   # the model-level hiding figure: the summed ops, each capped at its bound
        if e.get("rule") == "hides_communication" and e.get("tp") in (None, tp) and e.get("hidden_fraction") is not None:
            e["hidden_fraction"] = meta["model_efficiency"]["value"]
            e["efficiency"] = meta["model_efficiency"]
            e["reason"] = (f"hides {Efficiency.from_dict(meta['model_efficiency']).shown()} of exposed "
                           "communication (the ops summed, each capped at its bound)")
    layer = {t: json.loads((run_dir / "layer" / f"tp{t}.json").read_text()) for t in all_tps
             if (run_dir / "layer" / f"tp{t}.json").exists()}
    if layer:
        from .figures.pooled import block_pooled
        for rec in layer.values():
            rec["pooled"] = block_pooled(run_dir, rec)
        meta["layer"] = {str(t): rec for t, rec in layer.items()}
        _block_host_warning(meta["measurement"], layer)
    emit.write_decisions_json(run_dir / "decisions.json", records.values(), meta)

    def cfgs_at(t):
        ub, notes = _ub_cfgs_at(s, points_by_op, t, floor)
        rec = layer.get(t)
        if rec and rec.get("numerics_failed"):
            notes = [f"WARNING: on the block at TP={t} every overlapped setting failed the numerics check "
                     f"against no overlap ({rec['reason']}); check numerics before training with this file"] + notes
        if rec and s.backend == "te" and rec.get("winner"):
            from .layer import presets_dir
            win = parse_case_id(rec["winner"])
            ub = ubcfg.load_preset(win.variant.preset, [presets_dir(run_dir)])
            notes = [f"block-level winner at TP={t} ({rec['num_layers']} layers): {win.variant_id}: {rec['reason']}"] + notes
        return ub, notes

    for t in all_tps:  # one file per TP measured; the model TP's is tp_comm_overlap_cfg.yaml
        ub, notes = cfgs_at(t)
        emit.write_tp_comm_overlap_cfg(run_dir / f"tp_comm_overlap_cfg.tp{t}.yaml", ub, model=m.name,
                                       workload=meta["workload"], tp=t, notes=notes, fp8=w.is_fp8)
    ub, notes = cfgs_at(max(tp, all_tps[0]) if all_tps else 2)
    if tp == 1:
        notes.insert(0, "model-level decision: no TP (TP=1); entries are for the smallest TP measured")
    emit.write_tp_comm_overlap_cfg(run_dir / "tp_comm_overlap_cfg.yaml", ub, model=m.name,
                                   workload=meta["workload"], tp=max(tp, all_tps[0]) if all_tps else None,
                                   notes=notes, fp8=w.is_fp8)
    emit.write_ub_cfgs_json(run_dir / "ub_cfgs.json", ub, fp8=w.is_fp8)
    _write_megatron_switches(s, run_dir, ub, meta)

    choices = []
    for op, rec in records.items():
        n = (rec["config"] or {}).get("chunks", 1)
        if rec["tp"] > 1:
            choices += [(g, n) for g in op_gemms(op, rec["tp"], s.model) if g.gemm != "wgrad"]
    chunk_notes = [f"chunk counts per unsplit GEMM shape [m, k, n] (seed 004 customized_cc); "
                   f"1 = no overlap; model {m.name}, {s.backend} backend"]
    try:
        shape_map = emit.chunked_shape_map(choices)
    except ValueError as exc:
        shape_map, chunk_notes = {"customized_cc": {}}, chunk_notes + [f"not expressible: {exc}"]
    emit.write_chunked_cfg(run_dir / "chunked_cfg.yaml", shape_map, chunk_notes)
    return records


def _model_efficiency(records: dict, points_by_op: dict) -> dict:
    """The capped efficiency of the summed ops (figures.efficiency.model_efficiency), each op at the TP
    its evidence was taken."""
    triples = {}
    for op, rec in records.items():
        pts = points_by_op[op]
        tp = rec["tp"] if rec["tp"] in pts else min(pts)
        p = pts[tp]
        cands = {c["case"]: c for c in [p.get("none"), *p["candidates"].values()] if c}
        win = cands.get((rec.get("winner") or {}).get("case"))
        triples[op] = (p.get("none"), win, p.get("nocomm"))
    return model_efficiency(triples).to_dict()


def _block_host_warning(measurement: dict, layer: dict) -> None:
    """The report's host warning covers block sessions: settings of the block whose batches never got the
    host ahead, counted, and block batches whose host-ahead verdict was recorded without its figures."""
    behind, unproven = [], []
    for t, rec in layer.items():
        for row in rec.get("settings") or []:
            h = row.get("host_batches") or {}
            if h.get("failed"):
                behind.append({"case": row["case"], "failed": h["failed"], "batches": h["batches"],
                               "attempts": h["attempts"]})
            if h.get("unproven"):
                unproven.append({"case": row["case"], "unproven": h["unproven"], "batches": h["batches"]})
    measurement["block_host_behind"] = behind
    measurement["block_host_unproven"] = unproven
    if behind:
        n = sum(b["failed"] for b in behind)
        tot = sum(b["batches"] for b in behind)
        msg = (f"block batches not host-ahead: {n} of {tot} batches of {len(behind)} block setting(s) failed the "
               f"host-ahead check after every attempt; their block figures include host time.")
        measurement["warning"] = " ".join(x for x in (measurement.get("warning"), msg) if x)


def measurement_summary(run_dir: Path, points_by_op: dict, floor: float, device: str = "cuda") -> dict:
    """How far the run's measurements can be trusted: the drift canary over the run (one reference
    re-measured at every session's start), the noise of rounds within sessions against what the round
    budget can resolve (search.session_noise), bound faults, ops whose host launch time reaches their
    GPU time, and batches where the host did not stay ahead. ``device`` names the remedy (cuda | cpu)."""
    from .search.rounds import drift

    canaries = []
    for sj in sorted(Path(run_dir).glob("sessions/**/session.json")):
        c = json.loads(sj.read_text()).get("canary")
        if c and c.get("ms"):
            canaries.append(c)
    canaries.sort(key=lambda c: c["t"])
    by_case: dict[str, list] = {}
    for c in canaries:
        by_case.setdefault(c["case"], []).append(c["ms"])
    drifts = {k: drift(v) for k, v in by_case.items()}
    worst = max((d for d in drifts.values() if d is not None), default=None)
    clocks = {}
    for case in by_case:
        cs = [c for c in canaries if c["case"] == case and c.get("sm_mhz")]
        if len(cs) >= 2:
            mhz = [c["sm_mhz"] for c in cs]
            clocks[case] = {"sm_mhz_min": min(mhz), "sm_mhz_max": max(mhz), "sm_mhz_drift": drift(mhz),
                            "cycles_drift": drift([c["ms"] * c["sm_mhz"] for c in cs])}
    faults, host_bound, behind, stepped = [], set(), set(), set()
    for op, pts in points_by_op.items():
        for tp, p in pts.items():
            faults += p.get("bound_faults") or []
            host_bound.update(p.get("host_bound") or [])
            behind.update(p.get("host_behind") or [])
            stepped.update(p.get("stepped") or [])
    noisy = worst is not None and worst > floor
    warnings = []
    if noisy:
        warnings.append(f"machine noise: the drift canary moved {worst:.1%} over the run, more than the "
                        f"{floor:.0%} margin. Decisions inside one session compare rounds side by side and "
                        f"are unaffected; comparisons across sessions (TP sizes) are less certain than their "
                        f"intervals say.")
    rounds_noise = session_noise.op_noise(run_dir)
    rounds_warning = session_noise.noise_warning(rounds_noise, floor, device)
    if rounds_warning:
        warnings.append(rounds_warning)
    if faults:
        warnings.append(f"{len(faults)} bound fault(s): see below.")
    return {"canary": canaries, "canary_drift": drifts, "canary_clock": clocks, "worst_drift": worst, "noisy": noisy,
            "session_noise": rounds_noise, "session_noise_limits": session_noise.noise_limits(rounds_noise, floor),
            "session_noisy": rounds_warning is not None, "warning": " ".join(warnings) or None,
            "bound_faults": faults, "host_bound": sorted(host_bound), "host_behind": sorted(behind),
            "stepped": sorted(stepped), "step_limit": STEP_FACTOR * floor}


def _write_megatron_switches(s: Settings, run_dir: Path, ub: dict, meta: dict) -> None:
    """Megatron-LM flags and TransformerConfig overrides beside tp_comm_overlap_cfg.yaml: every op
    overlapped with the emitted ub_cfgs (the block-level choice), the switches that express it."""
    from .search import megatron_flags as mf

    if s.backend != "te":
        return
    try:
        sw = mf.block_switches(ub)   # as the layer stage built the block
    except ValueError as exc:
        meta["megatron_switches_error"] = str(exc)
        return
    mf.write_megatron_flags(run_dir / "megatron_flags.txt", sw, "tp_comm_overlap_cfg.yaml")
    mf.write_transformer_config_yaml(run_dir / mf.OVERRIDES_FILE, sw)
    emit.write_bridge_overlap_py(run_dir / emit.BRIDGE_FILE, ub, sw, model=meta["model"],
                                 workload=meta["workload"], fp8=s.model.workload.is_fp8)
