"""Where a block's time above its bound goes, per layer TP (issue 35: "where TP 4's exposed time goes").

The block's bound is its own no-communication bound where the layer stage measured it (``layer.bound``:
the block's ``nocomm`` setting, TE's TP collectives as local copies); else it is estimated from the ops'
as the block without overlap less the tuned ops' exposed communication (num_layers x the sum over the ops
of no overlap - bound, each op alone): the fastest any overlap setting of these ops could make the block
(for an MoE block, TP communication of the tuned ops only, not the experts' all-to-all). Against it: the
share of that exposed time the tuned file hides on the block, the limit over each reference, and the
tuned block's time still above the estimate, split into what the ops alone leave above their bounds and
what only appears on the block (ops run beside each other there). All by medians of one session each
(the block's and each op's TP point): an account in ms, not a decision; the decisions' ratios and
intervals are elsewhere in the report."""
from __future__ import annotations

from tptune.cases import parse_case_id
from tptune.records.layer_result import decided_layers


def _ms(point: dict | None) -> float | None:
    if not point or point.get("status") not in (None, "ok"):
        return None
    return ((point.get("timing") or {}).get("total_ms") or {}).get("median")


def block_account(decisions: dict) -> list[dict]:
    """One account per layer TP whose block measured no overlap and the tuned file, and whose every op has
    its no overlap, its bound and its pick measured at that TP (decisions.json's ``points``)."""
    out = []
    for tp, rec in sorted(decided_layers(decisions["meta"]).items(), key=lambda kv: int(kv[0])):
        block = {row["variant"]: row.get("median_ms") for row in rec.settings if row.get("status") in (None, "ok")}
        tuned_variant = parse_case_id(rec.tuned).variant_id if rec.tuned else None
        none_ms, tuned_ms = block.get("none"), block.get(tuned_variant)
        ops = []
        for op, orec in decisions["ops"].items():
            p = (orec.get("points") or {}).get(str(tp)) or {}
            none, bound, pick = _ms(p.get("none")), _ms(p.get("nocomm")), _ms(p.get("fastest"))
            if None in (none, bound, pick):
                ops = None
                break
            ops.append({"op": op, "none_ms": none, "bound_ms": bound, "pick_ms": pick,
                        "setting": (p.get("fastest") or {}).get("case"),
                        "exposed_ms": none - bound, "left_ms": max(0.0, pick - bound)})
        if not ops or none_ms is None or tuned_ms is None:
            continue
        layers = int(rec.num_layers or 1)
        ops_exposed = layers * sum(o["exposed_ms"] for o in ops)
        measured = block.get("nocomm")     # the block's own bound, where the layer stage measured it
        bound = measured if measured is not None else none_ms - ops_exposed
        exposed = none_ms - bound
        if exposed <= 0:
            continue
        left = tuned_ms - bound
        in_ops = layers * sum(o["left_ms"] for o in ops)
        refs = [{"variant": v, "ms": ms, "limit": ms / bound, "hidden": (none_ms - ms) / exposed}
                for v, ms in block.items() if ms is not None and v not in ("none", "nocomm", tuned_variant)]
        out.append({"tp": int(tp), "num_layers": layers, "none_ms": none_ms, "tuned_ms": tuned_ms,
                    "tuned": tuned_variant, "exposed_ms": exposed, "bound_ms": bound,
                    "bound_measured": measured is not None, "ops_exposed_ms": ops_exposed,
                    "hidden": (none_ms - tuned_ms) / exposed, "left_ms": left, "in_ops_ms": in_ops,
                    "block_only_ms": left - in_ops, "ops": ops,
                    "references": sorted(refs, key=lambda r: r["ms"])})
    return out
