"""Where a block's time above its bound goes, per layer TP (issue 35: "where TP 4's exposed time goes").

The block's bound is its own no-communication bound where the layer stage measured it (``layer.bound``:
the block's ``nocomm`` setting, TE's TP collectives as local copies); else it is estimated from the ops'
as the block without overlap less the tuned ops' exposed communication (num_layers x the sum over the ops
of no overlap - bound, each op alone): the fastest any overlap setting of these ops could make the block
(for an MoE block, TP communication of the tuned ops only, not the experts' all-to-all). Against it: the
share of that exposed time each block setting hides (stats.efficiency's definition: from the block
session's paired rounds where the bound was measured there, else by medians; capped, never above 100%),
the limit over each reference, and the written file's block time still above the bound, split into what
the ops alone leave above their bounds and what only appears on the block (ops run beside each other
there). The written file is the block-level winner (decide.layer): the tuned combination unless the block
picked another, which the account then names, the tuned one among the references; for the torch
backend, where every op chose no overlap, the block without overlap (it hides nothing, and every
overlapped setting is a reference).
Where a setting reads below an estimated bound, the estimate is no bound for this block and the account
says so instead. An account in ms, not a decision; the decisions' ratios and intervals are elsewhere in
the report."""
from __future__ import annotations

from tptune.cases import parse_case_id
from tptune.records.layer_result import decided_layers
from tptune.records.measured_point import decided_points
from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import INF, point_case, point_median
from tptune.records.sessions import Session
from tptune.stats.bound import burned_in
from tptune.stats.efficiency import Efficiency, median_efficiency, op_efficiency


def _ms(point: MeasuredPoint | None) -> float | None:
    m = point_median(point)
    return None if m == INF else m


def _efficiency(session: Session | None, tp, variant: str, ms: float, none_ms: float, bound_ms: float,
                measured: bool) -> Efficiency:
    """A block setting's share of the exposed time: paired over the block session's rounds where the bound
    was measured in it, else by medians."""
    pts = session.points if session is not None else {}
    none, bound = pts.get(f"layer-tp{tp}-none"), pts.get(f"layer-tp{tp}-nocomm")
    if measured and none and bound:
        return op_efficiency(none, pts.get(f"layer-tp{tp}-{variant}"), burned_in(bound))
    return median_efficiency(none_ms, ms, bound_ms)


def block_account(decisions: dict, layer_sessions: dict[int, Session | None] | None = None) -> list[dict]:
    """One account per layer TP whose block measured no overlap and the tuned file, and whose every op has
    its no overlap, its bound and its pick measured at that TP (decisions.json's ``points``);
    ``layer_sessions``: each layer TP's recorded block session, for the paired figures."""
    out = []
    for tp, rec in sorted(decided_layers(decisions["meta"]).items(), key=lambda kv: int(kv[0])):
        block = {row["variant"]: row.get("median_ms") for row in rec.settings if row.get("status") in (None, "ok")}
        tuned_variant = parse_case_id(rec.tuned).variant_id if rec.tuned else None
        written = parse_case_id(rec.winner).variant_id if rec.winner else tuned_variant
        if block.get(written) is None:
            written = tuned_variant
        none_ms, written_ms = block.get("none"), block.get(written)
        ops = []
        for op in decisions["ops"]:
            p = decided_points(decisions, op, tp)
            none, bound, pick = _ms(p.get("none")), _ms(p.get("nocomm")), _ms(p.get("fastest"))
            if None in (none, bound, pick):
                ops = None
                break
            if written == "none":   # the file holds no overlap for every op: the ops' picks are their no overlap
                pick, p = none, {"fastest": p.get("none")}
            ops.append({"op": op, "none_ms": none, "bound_ms": bound, "pick_ms": pick,
                        "setting": point_case(p.get("fastest")),
                        "exposed_ms": none - bound, "left_ms": max(0.0, pick - bound)})
        if not ops or none_ms is None or written_ms is None:
            continue
        layers = int(rec.num_layers or 1)
        ops_exposed = layers * sum(o["exposed_ms"] for o in ops)
        # the block's own bound, where the layer stage measured it and its output and gradients were finite:
        # a bound that computed inf/NaN ran another computation than the block's, so the ops' estimate stands
        nocomm_failed = any(r["variant"] == "nocomm" and (r.get("numerics") or {}).get("ok") is False
                            for r in rec.settings)
        measured = None if nocomm_failed else block.get("nocomm")
        bound = measured if measured is not None else none_ms - ops_exposed
        exposed = none_ms - bound
        if exposed <= 0:
            continue
        settings = {v: ms for v, ms in block.items() if ms is not None and v not in ("none", "nocomm")}
        below = sorted(v for v, ms in settings.items() if ms < bound)
        session = (layer_sessions or {}).get(int(tp))
        eff = {v: _efficiency(session, tp, v, ms, none_ms, bound, measured is not None) for v, ms in settings.items()}
        # a file of no overlap (torch, every op chose it) hides nothing by definition, as an op that chose it
        eff["none"] = Efficiency(0.0, 0.0, 0.0, 0, raw=0.0, why="no overlap chosen")
        left = written_ms - bound
        in_ops = layers * sum(o["left_ms"] for o in ops)
        refs = [{"variant": v, "ms": ms, "limit": ms / bound, "hidden": eff[v].value, "shown": eff[v].shown()}
                for v, ms in settings.items() if v != written]
        out.append({"tp": int(tp), "num_layers": layers, "none_ms": none_ms, "written_ms": written_ms,
                    "written": written, "picked_over_tuned": written != tuned_variant,
                    "exposed_ms": exposed, "bound_ms": bound,
                    "bound_measured": measured is not None, "bound_not_finite": nocomm_failed,
                    "ops_exposed_ms": ops_exposed,
                    # an estimate some setting reads below is no bound for this block
                    "not_a_bound": below if measured is None else [],
                    "hidden": eff[written].value, "hidden_shown": eff[written].shown(),
                    "left_ms": left, "in_ops_ms": in_ops, "block_only_ms": left - in_ops, "ops": ops,
                    "references": sorted(refs, key=lambda r: r["ms"])})
    return out
