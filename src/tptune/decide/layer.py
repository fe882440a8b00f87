"""The layer stage: the per-op choices proven on a whole transformer block.

Per TP measured for every op, one session (the same harness as the per-op cases: GPU time with the
host ahead, alternating rounds, ratio intervals) times ``layer.num_layers`` transformer layers of the
model's real shapes, fwd+bwd, slowest rank, with:
  te:    no overlap, TE defaults, every configured preset, and the tuned combination (each op's
         chosen userbuffers setting at that TP, written as the run's preset ``tuned_tp<N>``); where it
         differs, also the fastest combination (each op's fastest userbuffers setting by estimate,
         ``fastest_tp<N>``): per op, ties go to the cheaper setting, so the tuned combination can leave
         up to the margin per op on the table; the block says whether those estimates add up;
  torch: no overlap, the bound, and chunked.n<N> with the chunk count most ops chose; the tuned
         combination is that block, or no overlap where every op chose it (torch_block_choice).
The block-level winner is the tuned combination unless a reference beats it beyond the margin; then
the fastest such reference, and the report says so. The fastest combination is where the per-op
finalists (stats.finalists: faster than the cheaper pick beyond the noise, within the margin) meet the
block: it wins when it is faster than the tuned combination beyond the noise (tuned / fastest entirely
above 1), within the margin or not; otherwise the tuned one stays. The same rounds choose the file and
measure it, so the record adds the file's figures on rounds that did not choose it (``held_out``:
decide.held_out, each round scored by the choice made without it).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from tptune.cases import Case, make_case, parse_case_id
from tptune.decide.held_out import held_out
from tptune.decide.tp_point import best_at, ub_cfgs_at
from tptune.model.ops import COLUMN_OPS
from tptune.records.measured_point import MeasuredPoint
from tptune.records.sessions import Session
from tptune.stats.bound import burned_in, is_bound
from tptune.stats.host_evidence import summary as host_summary
from tptune.stats.noise import compare_points
from tptune.stats.numerics import describe_failure
from tptune.stats.wording import classify_ratio
from tptune.te.megatron_flags import block_switches, op_mode
from tptune.te.ubcfg import PRESETS_DIR, case_ub_cfgs, op_entries, preset_environment


def block_layers(m, n: int) -> list[str]:
    """What each of the block's ``n`` layers is (worker/torch_block and te_block build it so), for the report."""
    out = []
    for moe in m.block_pattern(n):
        if not moe:
            out.append("dense (attention + MLP)")
            continue
        shared = (f", shared expert {m.moe_shared_expert_intermediate_size} wide (fc1/fc2)"
                  if m.moe_shared_expert_intermediate_size else "")
        out.append(f"MoE (attention + router + {m.num_moe_experts} routed experts, top-{m.moe_router_topk}, "
                   f"{m.moe_ffn_hidden_size} wide{shared})")
    return out


def tuned_preset(tp: int) -> str:
    return f"tuned_tp{tp}"


def fastest_preset(tp: int) -> str:
    return f"fastest_tp{tp}"


def other_mode_preset(tp: int) -> str:
    return f"tuned_other_dgrad_tp{tp}"


@dataclass(frozen=True)
class BlockPreset:
    """A combination the block measures, as the run's preset ``name`` (emit.presets writes it)."""
    name: str
    ub_cfgs: dict
    header: tuple[str, ...]   # the title, then the notes


def _megatron_expressible(cfgs: dict) -> bool:
    try:
        block_switches(cfgs)
    except ValueError:
        return False
    return True


def _dgrad_mode(case_id: str, wl: str) -> str | None:
    """"bulk" or "rs_dgrad" for a userbuffers setting of a column op, else None."""
    c = parse_case_id(case_id)
    if c.variant.kind != "ub" or c.op not in COLUMN_OPS:
        return None
    return op_mode(c.op, op_entries(case_ub_cfgs(c, workload=wl), c.op))


def per_mode_combos(s, by_op: dict, tp: int, floor: float, fastest: bool) -> list[tuple]:
    """[(estimate ms, mode, ub_cfgs, notes)]: per dgrad mode in which every measured column op has a
    userbuffers setting, the per-op choices with the column ops' candidates restricted to that mode.
    The estimate sums the column ops' fastest median in that mode."""
    wl = s.model.workload.ub_rules
    modes = {op: {cid: _dgrad_mode(cid, wl) for cid in pts[tp]["candidates"]}
             for op, pts in by_op.items() if op in COLUMN_OPS and tp in pts}
    out = []
    for mode in ("bulk", "rs_dgrad"):
        sub, est = dict(by_op), 0.0
        for op, of in modes.items():
            p = by_op[op][tp]
            cands = {cid: q for cid, q in p["candidates"].items() if of[cid] in (mode, None)}
            in_mode = [q.median() for cid, q in cands.items() if of[cid] == mode]
            in_mode = [m for m in in_mode if m != float("inf")]
            if not in_mode:
                break
            est += min(in_mode)
            sub[op] = {**by_op[op], tp: {**p, "candidates": cands}}
        else:
            cfgs, notes = ub_cfgs_at(s, sub, tp, floor, fastest=fastest)
            if _megatron_expressible(cfgs):
                out.append((est, mode, cfgs, notes))
    if not out:
        raise ValueError(f"TP={tp}: no dgrad mode in which qkv and fc1 both have a measured userbuffers setting")
    return out


def _preset(name: str, cfgs: dict, notes: list[str], title: str) -> BlockPreset:
    return BlockPreset(name, cfgs, (title, *notes))


def layer_members(s, tp: int, points_by_op: dict[str, dict]) -> tuple[list[Case], Case, list[BlockPreset]]:
    """The block session's settings, the tuned one among them, and the presets (te) they name, which the
    run's presets/ must hold before the block is measured."""
    block_presets = []
    if s.backend == "te":
        by_op = {op: {tp: p} for op, p in points_by_op.items()}
        floor = s.decision.noise_floor
        cfgs, notes = ub_cfgs_at(s, by_op, tp, floor)
        fast, fast_notes = ub_cfgs_at(s, by_op, tp, floor, fastest=True)
        other = None       # (mode, ub_cfgs, notes) of the other dgrad mode's combination
        if not _megatron_expressible(cfgs):
            # qkv and fc1 chose different dgrad modes, which one Megatron switch cannot give: the block
            # measures the per-op choices within each mode, the likelier one (by the ops' estimates) as tuned
            combos = sorted(per_mode_combos(s, by_op, tp, floor, fastest=False), key=lambda c: c[0])
            (_, mode, cfgs, notes), *rest = combos
            notes = [f"qkv and fc1 chose different dgrad modes (tp_comm_overlap_rs_dgrad is one switch): "
                     f"this is the {mode} combination"] + notes
            if rest:
                other = rest[0][1:]
        if not _megatron_expressible(fast):   # every combination _per_mode_combos returns is
            _, _, fast, fast_notes = per_mode_combos(s, by_op, tp, floor, fastest=True)[0]
        block_presets.append(_preset(tuned_preset(tp), cfgs, notes, f"tuned combination at TP={tp}, per op:"))
        presets = s.search.te_presets
        # the block's own bound: the local-copy collectives keep a dense block's shapes; an MoE block's token
        # dispatch gathers routing counts through them too, which copies cannot stand in for
        bound = s.layer.bound and not s.model.model.is_moe
        variants = ["none"] + (["nocomm"] if bound else []) + ["ub.te"] + \
            [f"ub.{p}" for p in presets] + [f"ub.{tuned_preset(tp)}"]
        if other is not None:
            omode, ocfgs, onotes = other
            block_presets.append(_preset(other_mode_preset(tp), ocfgs, onotes,
                                         f"tuned combination at TP={tp} with every column op's dgrad {omode}, per op:"))
            variants.append(f"ub.{other_mode_preset(tp)}")
        if fast != cfgs and (other is None or fast != other[1]):
            block_presets.append(_preset(fastest_preset(tp), fast, fast_notes, f"fastest combination at TP={tp} "
                                         "(each op's fastest userbuffers setting by estimate):"))
            variants.append(f"ub.{fastest_preset(tp)}")
        tuned = make_case("layer", tp, f"ub.{tuned_preset(tp)}")
    else:
        n, tuned_variant = torch_block_choice(points_by_op, s.decision.noise_floor)
        variants = ["none", "nocomm", f"chunked.n{n}"]
        tuned = make_case("layer", tp, tuned_variant)
    return [make_case("layer", tp, v) for v in dict.fromkeys(variants)], tuned, block_presets


def torch_block_choice(points_by_op: dict[str, dict], floor: float) -> tuple[int, str]:
    """(the chunk count the torch block measures, the block variant that stands for the per-op choices):
    the chunk count most ops' fastest settings use (2 where none is chunked); the per-op choices (ties to
    the cheaper setting, decide.tp_point.best_at) are that block, or ``none`` where every op chose no
    overlap: the chunk map then holds 1 for every shape, which is the block without overlap, and the
    chunked block is measured beside it as the overlap to beat. Where the ops chose differently the
    block cannot measure their map and the chunked block stands in for it (decide.file_sets grades that
    map unproven)."""
    fastest = [parse_case_id(p["best"].case).variant for p in points_by_op.values() if p.get("best")]
    chunks = [v.chunks for v in fastest if v.kind == "chunked"]
    n = Counter(chunks).most_common(1)[0][0] if chunks else 2
    picks = [parse_case_id(best_at(p, floor)[0].case).variant for p in points_by_op.values() if p.get("none")]
    if picks and all(v.kind == "none" for v in picks):
        return n, "none"
    return n, f"chunked.n{n}"


def recipe_environment(case_id: str) -> dict[str, str]:
    """The environment a shipped preset's case runs with (te.ubcfg.preset_environment: e.g. the layernorm
    SM margins of NVIDIA's recipes); {} for every other setting, the run's own presets included."""
    v = parse_case_id(case_id).variant
    if v.kind != "ub" or not (PRESETS_DIR / f"{v.preset}.yaml").is_file():
        return {}
    return preset_environment(v.preset)


def layer_record(s, tp: int, session: Session, tuned_id: str) -> dict:
    """The block-level comparison of one TP from its recorded block ``session``."""
    sess, runs = session.record, session.points
    # the block's bound without its burn-in round, as every figure the bound enters (stats.bound)
    pts = {c: burned_in(p.slim()) if is_bound(c) else p.slim() for c, p in runs.items()}
    floor = s.decision.noise_floor
    rows, winner, reason, numerics_failed = _choose(pts, runs, tuned_id, tp, floor)
    if winner not in (tuned_id, None):
        # the file holds the winner: the user's figures are it against each reference, from this session
        for row in rows:
            if row["case"] != winner:
                row["file_vs"] = _versus(pts[winner], pts[row["case"]], floor)
    num_layers = int(s.layer.num_layers)
    # the bound is no comparison
    compared = any(r["median_ms"] for r in rows if r["case"] != tuned_id and r["variant"] != "nocomm")
    out = {"tp": tp, "session": sess["session"], "rounds": sess["rounds"], "stop": sess["stop"],
           "num_layers": num_layers, "tuned": tuned_id, "built": block_layers(s.model.model, num_layers),
           "winner": winner, "reason": reason, "numerics_failed": numerics_failed, "compared": compared,
           "settings": rows}
    if winner is not None:
        # the file's figures on rounds that did not choose it (decide.held_out: leave one round out)
        ho = held_out(pts, winner, lambda fold: _choose(fold, runs, tuned_id, tp, floor)[1]
                      if tuned_id in fold else None, floor)
        if ho is not None:
            out["held_out"] = ho
    return out


def _choose(pts: dict[str, MeasuredPoint], runs: dict[str, MeasuredPoint], tuned_id: str, tp: int,
            floor: float) -> tuple[list[dict], str | None, str, bool]:
    """(the block's rows, the setting the file holds, why, whether no setting passed its numerics) from the
    block session's points ``pts`` (the bound burned in; ``runs`` as recorded, for numerics and host
    evidence): the block-level choice (module doc)."""
    tuned = pts[tuned_id]
    rows = []
    for cid, p in pts.items():
        row = {"case": cid, "variant": parse_case_id(cid).variant_id, "status": p.status,
               "median_ms": None if p.median() == float("inf") else p.median(),
               "host_ms": p.host_ms, "correct": runs[cid].correct,
               "numerics": numerics_row(runs[cid].correctness)}
        row["host_batches"] = host_summary(runs[cid])
        env = recipe_environment(cid)
        if env:
            row["environment"] = env
        if cid != tuned_id:
            failed = None
            t_failed, p_failed = tuned.median() == float("inf"), p.median() == float("inf")
            if t_failed or p_failed:   # a failed side is no tie: nothing was compared
                failed = "both" if t_failed and p_failed else "the tuned setting" if t_failed else "this setting"
            row["tuned_vs"] = _versus(tuned, p, floor, failed)
        rows.append(row)
    kind = parse_case_id(tuned_id).variant.kind
    # the settings a file of this backend can hold: te's a userbuffers config; torch's chunk map holds any
    # chunk count per shape, 1 being no overlap
    kinds = {"none", "chunked"} if kind in ("none", "chunked") else {kind}
    # an emitted config must pass the numerics check on the block: failing settings cannot win; nor can a
    # reference measured with its recipe's environment, which no file of the set carries
    passing = [r for r in rows if r["median_ms"] and r["correct"] is not False
               and parse_case_id(r["case"]).variant.kind in kinds and not r.get("environment")]
    beaten_by = [r for r in passing if r["case"] != tuned_id and r.get("tuned_vs", {}).get("outcome") == 1]
    finalist = [r for r in passing if r["variant"] == f"ub.{fastest_preset(tp)}"
                and ((r.get("tuned_vs") or {}).get("ratio") or {}).get("lo", 0) > 1.0]
    tuned_row = next(r for r in rows if r["case"] == tuned_id)
    numerics_failed = False
    if tuned.median() == float("inf") or tuned_row["correct"] is False:
        why = ("failed on the block" if tuned.median() == float("inf") else
               f"failed the numerics check on the block ({(tuned_row['numerics'] or {}).get('why') or 'see the numerics column'})")
        others = [r for r in passing if r["case"] != tuned_id]
        winner = min(others, key=lambda r: r["median_ms"])["case"] if others else None
        numerics_failed = winner is None and tuned_row["correct"] is False
        reason = (f"the tuned combination {why}: the file holds the fastest setting that passed, {winner}"
                  if winner else f"the tuned combination {why} and no other overlapped setting passed on the "
                  "block: no file is written for this TP (see the numerics column)")
    elif finalist and not beaten_by:
        winner, vs = finalist[0]["case"], finalist[0]["tuned_vs"]
        reason = (f"the finalists' combination {winner} is faster than the tuned combination on the block beyond "
                  f"the noise (tuned / it {_iv(vs['ratio'])}: {vs['words']}): the file holds it")
    elif beaten_by:
        winner = min(beaten_by, key=lambda r: r["median_ms"])["case"]
        reason = (f"{winner} beats the tuned combination on the block beyond the noise: the file holds it")
    else:
        winner, reason = tuned_id, _unbeaten(rows, tuned_id)
        if kind == "none":   # torch: every op chose no overlap (torch_block_choice)
            reason = ("every op chose no overlap, which on the block is `none`; " + reason.replace(
                "no reference beats the tuned combination", "no overlapped setting beats it"))
    if winner not in (tuned_id, None) and not numerics_failed and tuned_row["correct"] is not False:
        behind = _host_behind(tuned_row, next(r for r in rows if r["case"] == winner))
        if behind:   # a pick over the tuned file must rest on GPU time; host launch time is not the overlap's
            reason = (f"{winner} reads faster than the tuned combination on the block, but {behind} did not get the "
                      "host ahead, so the block figures include host launch time, not GPU time alone: the file "
                      "keeps the tuned combination")
            winner = tuned_id
    by_recipe = [r["case"] for r in rows if r.get("environment") and (r.get("tuned_vs") or {}).get("outcome") == 1]
    if by_recipe:
        reason += (f"; {', '.join(by_recipe)} beat{'s' if len(by_recipe) == 1 else ''} it beyond the noise with "
                   "its recipe's environment, which no file of the set carries: measured, never written")
    return rows, winner, reason, numerics_failed


def _versus(a: MeasuredPoint, b: MeasuredPoint, floor: float, failed: str | None = None) -> dict:
    """a against b on the block (a wins ties), as the layer record keeps it: the comparison, which side
    failed where one did, and the report's words for the ratio."""
    vs = compare_points(a, b, floor=floor, tie="a").to_dict()
    if failed:
        vs["failed"] = failed
    vs["words"] = classify_ratio(vs.get("ratio"), floor)
    return vs


def numerics_row(res: dict | None) -> dict | None:
    """A setting's numerics as the report and decisions.json show them: the verdict, the tensors that
    failed and by how much, and per tensor (output, input gradient, worst weight gradient) the relative
    L2 error and max |diff| against the higher-precision block beside no overlap's. A run measured
    before stats.numerics (TE's pairwise criterion) keeps its verdict and says so."""
    if not res:
        return None
    if "factor_l2" not in res:
        return {"ok": res.get("ok"), "criterion": res.get("criterion") or res.get("checked"), "legacy": True}
    return {"ok": res["ok"], "failed": res["failed"], "why": describe_failure(res) or None,
            "reference": res.get("reference_block"), "summary": res["summary"],
            "factor_l2": res["factor_l2"], "factor_max": res["factor_max"]}


def _unbeaten(rows: list[dict], tuned_id: str) -> str:
    """The verdict where nothing beat the tuned combination, naming what was not compared: a setting that
    failed on the block beat nothing and lost to nothing."""
    others = [r for r in rows if r["case"] != tuned_id and r["variant"] != "nocomm"]
    failed = [r["case"] for r in others if not r["median_ms"]]
    if not failed:
        return "no reference beats the tuned combination on the block beyond the noise"
    if len(failed) == len(others):
        return (f"nothing was compared on the block: {', '.join(failed)} failed, so the tuned combination "
                "was measured alone and is unproven; the file holds the per-op choices")
    return (f"no measured setting beats the tuned combination on the block beyond the noise; not compared "
            f"({', '.join(failed)} failed)")


def _host_behind(*rows: dict) -> str:
    """In words, the batches of these block rows whose host never got ahead of the GPU; "" when none."""
    parts = []
    for r in rows:
        hb = r.get("host_batches") or {}
        if hb.get("failed"):
            parts.append(f"{hb['failed']} of {hb['batches']} batches of {r['variant']}")
    return " and ".join(parts)


def _iv(r: dict) -> str:
    return f"{r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}], {r['rounds']} rounds"

