"""The run's answer: each op's choice, the model TP, the layer stage's block winner, and the files to
write (decisions.json's records and meta, and through decide.file_sets one coherent set of files per TP
that users load); emit writes them."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from tptune.cases import parse_case_id
from tptune.decide.decision_record import decisions_record
from tptune.decide.file_sets import FileSets, file_sets
from tptune.decide.summary import (
    block_host_warning,
    measurement_summary,
    summed_efficiency,
)
from tptune.decide.tp import apply_floor, memory_floor, model_scaling, model_tp, settle_undecided
from tptune.decide.tp_point import (
    best_at,
    knob_summary,
    pooled_pairs,
    setting_of,
    tied_with,
    with_verdict,
)
from tptune.records import load
from tptune.records.run_dir import RunDir, is_packed_session, layer_session_name
from tptune.records.sessions import Session, load_pooled_with, load_sessions, named, recorded_gpu_memory
from tptune.settings.resolve import Settings
from tptune.stats.efficiency import Efficiency, op_efficiency
from tptune.stats.finalists import finalists
from tptune.stats.noise import compare_points
from tptune.stats.pooled import block_pooled


@dataclass(frozen=True)
class Answer:
    """decisions.json's ``records`` ({op: record}) and ``meta`` (meta["files"] is ``file_sets.record``),
    and the file sets to write."""
    records: dict[str, dict]
    meta: dict
    file_sets: FileSets


def recorded_points(run: RunDir, op: str, tps) -> dict[int, dict]:
    """{tp: point.json of (op, TP)} with the trace verdicts of their best settings (with_verdict)."""
    return {tp: with_verdict(load.tp_point(run, op, tp), load.point_analysis(run, op, tp)) for tp in tps}


def _op_choice(s: Settings, op: str, final: dict, points: dict[int, dict], sessions: list[Session]) -> dict:
    """Chosen TP and setting of one op, with runner-up and evidence, from its recorded TP points
    (recorded_points). TP=1 (no tensor parallelism) has no setting of its own: its evidence is the
    start TP's points, where no setting hid enough."""
    floor = s.decision.noise_floor
    chosen = final["chosen_tp"]
    at = points.get(chosen) or points[max((t for t in points if t <= chosen), default=min(points))]
    winner, runner_up, comparisons = best_at(at, floor)
    case = parse_case_id(winner.case)
    unjudged = next((e["reason"] for e in final.get("evidence", []) if e.get("rule") == "measured"
                     or "nothing to judge" in str(e.get("reason", ""))), None)
    if chosen != 1 and chosen not in points:
        # the memory floor raised the op to a TP this run did not measure: there is no setting for it
        config = {"tp": chosen, "case": None, "variant": "not measured",
                  "note": f"TP={chosen} (the memory floor) was not measured in this run (tp_sizes "
                          f"{sorted(points)}): no setting for it; the evidence below is TP={case.tp}'s"}
    elif chosen == 1:
        # where a reference or every overlapped setting failed, nothing was compared: say that, not a verdict
        config = {"tp": 1, "case": None, "variant": "no TP",
                  "note": (f"nothing was compared at TP={case.tp} ({unjudged}): no TP, unproven" if unjudged else
                           f"no overlap setting hid the communication at TP={case.tp}; "
                           f"fastest there: {winner.case}")}
    else:
        config = setting_of(case)
    rec = decisions_record(op, tp=chosen, config=config, winner=winner, runner_up=runner_up,
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
    rec["pooled"] = pooled_pairs(sessions, winner, {"none": at.get("none"), "runner_up": runner_up,
                                                    "bound": at.get("nocomm")})
    rec["points"] = {str(tp): {"none": p["none"], "nocomm": p["nocomm"], "best": p["best"],
                               "verdict": p["verdict"], "verdict_reason": p["verdict_reason"],
                               "fastest": best_at(p, floor)[0]}
                     for tp, p in points.items()}
    return rec


def decide(s: Settings, run: RunDir, final_files: list[Path]) -> Answer:
    floor = s.decision.noise_floor
    # the packed block sessions (workload.packing) come after this decision and are not its evidence
    sessions = [x for x in load_sessions(run) if not is_packed_session(x.name)]
    records, points_by_op = {}, {}
    for f in final_files:
        final = load.read_json(f)
        points_by_op[final["op"]] = recorded_points(run, final["op"], final["measured_tps"])
        records[final["op"]] = _op_choice(s, final["op"], final, points_by_op[final["op"]], sessions)
    rule_tp, tp_evidence = model_tp(s, points_by_op)
    mem = memory_floor(s, recorded_gpu_memory(run))
    all_tps = sorted({t for pts in points_by_op.values() for t in pts})
    model_eff = summed_efficiency(records, points_by_op)
    rule_tp = settle_undecided(rule_tp, tp_evidence, model_eff, mem, model_scaling(s, points_by_op))
    tp, ev = apply_floor(rule_tp, {**mem, "measured_tps": all_tps}, "model")
    if ev:
        tp_evidence = tp_evidence + [ev]
    m, w = s.model.model, s.model.workload
    meta = {"model": m.name, "workload": {"seq_length": w.seq_length, "micro_batch_size": w.micro_batch_size,
                                          "dtype": w.dtype, **({"recipe": w.recipe} if w.is_fp8 else {})},
            "precision": w.precision_label,
            "backend": s.backend, "device": s.device, "model_tp": tp, "model_tp_rule": rule_tp,
            "model_tp_evidence": tp_evidence, "memory": mem,
            **({"model_tp_undecided": True} if any(e.get("undecided") for e in tp_evidence) else {}),
            "noise_floor": floor, "tp_tolerance": s.decision.tp_tolerance,
            "measurement": measurement_summary(sessions, points_by_op, floor, s.device)}
    meta["model_efficiency"] = model_eff
    for e in tp_evidence:   # the model-level hiding figure: the summed ops, each capped at its bound
        if (e.get("rule") == "hides_communication" and (e.get("tp") in (None, tp) or e.get("undecided"))
                and e.get("hidden_fraction") is not None):
            e["hidden_fraction"] = meta["model_efficiency"]["value"]
            e["efficiency"] = meta["model_efficiency"]
            e["reason"] = (f"{Efficiency.from_dict(meta['model_efficiency']).hides()} "
                           "(the ops summed, each capped at its bound)" + e.get("undecided_why", ""))
    layer = {t: replace(rec, pooled=block_pooled(rec, named(sessions, layer_session_name(rec.tp)),
                                                 load_pooled_with(run, rec.tp, rec.tuned)))
             for t, rec in load.layer_results(run, all_tps).items()}
    if layer:
        meta["layer"] = {str(t): rec.to_dict() for t, rec in layer.items()}
        block_host_warning(meta["measurement"], layer)
    sets = file_sets(s, run, points_by_op, layer, all_tps, meta)
    meta["files"] = sets.record
    return Answer(records, meta, sets)
