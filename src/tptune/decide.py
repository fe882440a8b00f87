"""From measured points to answers: the best setting per (op, TP), the TP decision, the final configs."""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from .cases import parse_case_id
from .ops import op_gemms
from .search import emit, tp_decision, ubcfg
from .search.noise import compare_points, cost_key
from .search.points import point_median
from .settings import Settings
from .workflow import point_cases, read_point, reference_cases


def _read(p: Path) -> dict:
    return json.loads(Path(p).read_text())


def slim(point: dict | None) -> dict | None:
    """What decisions need of a run.json: case, status, timing stats."""
    if point is None:
        return None
    return {"case": point["case"], "status": point["status"], "timing": point.get("timing") or {},
            "error": point.get("error")}


def pick_best(points: list[dict], floor: float) -> tuple[dict | None, list[dict]]:
    """Fastest point with noise: candidates in cost order; a challenger replaces the champion only
    when it wins beyond the margin, so ties stay with the cheaper setting."""
    ordered = sorted(points, key=lambda p: cost_key(p["case"]))
    champion, comparisons = None, []
    for p in ordered:
        if champion is None:
            champion = p
            continue
        cmp = compare_points(p, champion, floor=floor, tie="b")
        comparisons.append(cmp.to_dict())
        if cmp.winner == "a":
            champion = p
    return champion, comparisons


def _verdict(run_dir: Path, best: dict | None, op: str, tp: int) -> tuple[str | None, str | None]:
    from .analyze import case_summary
    from .trace import overlap_verdict

    if best is None:
        return None, None
    paths = [run_dir / "analysis" / op / f"tp{tp}" / f"{parse_case_id(c).variant_id}.parquet"
             for c in (best["case"], f"{op}-tp{tp}-none")]
    if not all(p.exists() for p in paths):
        return None, "trace analysis missing"
    (mine, e1), (base, e2) = (case_summary(pl.read_parquet(p)) for p in paths)
    if mine is None or base is None:
        return None, e1 or e2
    return overlap_verdict(mine, base)


def tp_point(s: Settings, op: str, tp: int, run_dir: Path) -> dict:
    """The evidence of one (op, TP): references, each search's winner, the tuned combination, the best."""
    floor = s.config["decision"]["noise_floor"]
    results = _read(run_dir / "search" / op / f"tp{tp}" / "results.json")
    winners, tuned = point_cases(s, op, tp, results, run_dir)
    refs = {c.variant_id: slim(read_point(run_dir / c.dir / "run.json")) for c in reference_cases(s, op, tp)}
    overlapped = {c: slim(p) for c, p in winners.items()}
    overlapped[tuned.id] = slim(read_point(run_dir / tuned.dir / "run.json"))
    overlapped.update({f"{op}-tp{tp}-{v}": p for v, p in refs.items() if v.startswith("ub.")})
    best, comparisons = pick_best(list(overlapped.values()), floor)
    if best is not None and point_median(best) == float("inf"):
        best = None
    ok = [p for p in overlapped.values() if point_median(p) != float("inf")]
    fastest = min(ok, key=point_median) if ok else None
    verdict, reason = _verdict(run_dir, best, op, tp)
    return {"op": op, "tp": tp, "none": refs["none"], "nocomm": refs["nocomm"], "best": best,
            "fastest_overlapped": fastest,
            "tuned_case": tuned.id, "references": refs, "candidates": overlapped,
            "comparisons": comparisons, "verdict": verdict, "verdict_reason": reason,
            "searches": {r["dim"]: {"best_case": r["best_case"], "path": r.get("path"), "asked": r["asked"],
                                    "measured": r["measured"]} for r in results}}


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


def tp_step(s: Settings, op: str, tp: int, points: dict[int, dict]) -> dict:
    measured = _tp_points(points)
    nxt = tp_decision.tp_next(op, measured, **_tp_rules(s))
    if s.config["decision"].get("explore_all_tps"):  # evidence runs: every TP, the rule decides after
        later = [t for t in s.tp_sizes if t > tp]
        nxt = later[0] if later else None
    rec = {"op": op, "tp": tp, "next": nxt, "measured_tps": sorted(points)}
    if nxt is None:
        chosen, evidence = tp_decision.tp_result(op, measured, **_tp_rules(s))
        rec.update({"chosen_tp": chosen, "evidence": evidence})
    return rec


def _op_choice(s: Settings, op: str, final: dict, run_dir: Path) -> dict:
    """Chosen TP and setting of one op, with runner-up and evidence. TP=1 (no tensor parallelism)
    has no setting of its own: its evidence is the start TP's points, where no setting hid enough."""
    floor = s.config["decision"]["noise_floor"]
    points = _points(run_dir, op, final["measured_tps"])
    chosen = final["chosen_tp"]
    at = points.get(chosen) or points[min(points)]
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
    rec["points"] = {str(tp): {"none": p["none"], "nocomm": p["nocomm"], "best": p["best"],
                               "verdict": p["verdict"], "verdict_reason": p["verdict_reason"],
                               "fastest": _best_at(p, floor)[0]}
                     for tp, p in points.items()}
    return rec


def _points(run_dir: Path, op: str, tps) -> dict[int, dict]:
    return {tp: _read(run_dir / "search" / op / f"tp{tp}" / "point.json") for tp in tps}


def _best_at(point: dict, floor: float) -> tuple[dict, dict | None, list]:
    """Fastest setting at one TP (no overlap included), the runner-up and the comparisons made."""
    candidates = [p for p in [point["none"], *point["candidates"].values()] if p]
    winner, comparisons = pick_best(candidates, floor)
    rest = [p for p in candidates if p is not winner and point_median(p) != float("inf")]
    return winner, (min(rest, key=point_median) if rest else None), comparisons


def _setting(case) -> dict:
    config = {"tp": case.tp, "case": case.id, "variant": case.variant_id}
    if case.variant.kind == "ub":
        config["ub_cfgs"] = {k: v for k, v in ubcfg.case_ub_cfgs(case).items() if k.startswith(case.op + "_")}
    if case.variant.kind == "chunked":
        config["chunks"] = case.variant.chunks
    return config


def _summed(points_by_op: dict[str, dict[int, dict]], tp: int, which: str, floor: float) -> dict | None:
    """A point whose time is the sum over ops (for the model-level TP rule)."""
    from .search.points import make_point

    total = 0.0
    for pts in points_by_op.values():
        p = pts[tp]
        q = _best_at(p, floor)[0] if which == "fastest" else p.get(which)
        t = point_median(q)
        if t == float("inf"):
            return None
        total += t
    return make_point(f"all-tp{tp}-{which}", [total])


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


def _ub_cfgs_at(s: Settings, points_by_op: dict, tp: int, floor: float) -> tuple[dict, list[str]]:
    """Ten-GEMM ub_cfgs for TP ``tp``: each op's fastest userbuffers setting there, else TE defaults."""
    per_op, notes = {}, []
    for op, pts in points_by_op.items():
        if tp not in pts:
            notes.append(f"{op}: not measured at TP={tp}: TE defaults")
            continue
        best = _best_at(pts[tp], floor)[0]
        case = parse_case_id(best["case"])
        if case.variant.kind == "ub":
            per_op[op] = ubcfg.case_ub_cfgs(case)
            notes.append(f"{op}: {best['case']} ({point_median(best):.3f} ms fwd+bwd)")
        else:
            notes.append(f"{op}: fastest at TP={tp} is {best['case']}: TE defaults written")
    if s.backend != "te":
        notes.append(f"{s.backend} backend run: no TE userbuffers were measured; entries are TE's defaults")
    return ubcfg.compose_ub_cfgs(per_op), notes


def decide(s: Settings, run_dir: Path, final_files: list[Path]) -> dict:
    floor = s.config["decision"]["noise_floor"]
    records, points_by_op = {}, {}
    for f in final_files:
        final = _read(f)
        records[final["op"]] = _op_choice(s, final["op"], final, run_dir)
        points_by_op[final["op"]] = _points(run_dir, final["op"], final["measured_tps"])
    tp, tp_evidence = model_tp(s, points_by_op)
    m, w = s.model.model, s.model.workload
    meta = {"model": m.name, "workload": {"seq_length": w.seq_length, "micro_batch_size": w.micro_batch_size,
                                          "dtype": w.dtype},
            "backend": s.backend, "device": s.device, "model_tp": tp, "model_tp_evidence": tp_evidence,
            "noise_floor": floor, "tp_tolerance": s.config["decision"]["tp_tolerance"]}
    emit.write_decisions_json(run_dir / "decisions.json", records.values(), meta)

    all_tps = sorted({t for pts in points_by_op.values() for t in pts})
    for t in all_tps:  # one file per TP measured; the model TP's is tp_comm_overlap_cfg.yaml
        ub, notes = _ub_cfgs_at(s, points_by_op, t, floor)
        emit.write_tp_comm_overlap_cfg(run_dir / f"tp_comm_overlap_cfg.tp{t}.yaml", ub, model=m.name,
                                       workload=meta["workload"], tp=t, notes=notes)
    ub, notes = _ub_cfgs_at(s, points_by_op, max(tp, all_tps[0]) if all_tps else 2, floor)
    if tp == 1:
        notes.insert(0, "model-level decision: no TP (TP=1); entries are for the smallest TP measured")
    emit.write_tp_comm_overlap_cfg(run_dir / "tp_comm_overlap_cfg.yaml", ub, model=m.name,
                                   workload=meta["workload"], tp=max(tp, all_tps[0]) if all_tps else None,
                                   notes=notes)
    emit.write_ub_cfgs_json(run_dir / "ub_cfgs.json", ub)

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
