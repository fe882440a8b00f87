"""TP size per op (seed 000, WORKFLOW 1 and 3), decided one measured TP at a time.

1. Measure at TP = start_tp (2). If no overlap setting hides the communication there (rule below),
   recommend no TP for the op: tp = 1.
2. Otherwise try TP x 2 while it fits in one node (<= gpus_per_node, and in ``allowed_tps`` when
   given) and while time(2·TP) <= time(TP) / 2 · (1 + tolerance); keep the last TP that passed.
   time(TP) is the faster of the best overlapped point and the no-overlap point at that TP.
   The tolerance (10%) is well above the noise floor (2%), so no extra noise margin is applied.

"Hides the communication" at a TP, from its no-overlap (none), no-collective bound (nocomm) and
best overlapped (best) points:
    exposed         = none - nocomm                (communication left on the critical path)
    hidden_fraction = (none - best) / exposed
  passes iff best beats none beyond the noise margin (noise.compare) AND
             hidden_fraction >= min_hidden_fraction (default 0.25) AND
             the trace analysis, when given and trust_verdict is set, does not say "not overlapped"
  It also passes when none is equivalent to nocomm within the margin (for points measured in rounds:
  their ratio interval lies inside the margin, not merely undecided): no communication is exposed,
  so TP costs nothing to hide. Where the bound does not read below none, no fraction is computed and it
  passes iff best beats none; the words say "bound fault" only where stats.bound.fault finds one (the
  report's one definition).
"""
from __future__ import annotations

from dataclasses import dataclass

from tptune.records.measured_point import MeasuredPoint
from tptune.records.point_fields import INF, point_case, point_median
from tptune.stats.bound import fault
from tptune.stats.efficiency import op_efficiency
from tptune.stats.noise import DEFAULT_FLOOR, DEFAULT_K, compare_points

DEFAULT_START_TP = 2
DEFAULT_GPUS_PER_NODE = 8
DEFAULT_TOLERANCE = 0.10
DEFAULT_MIN_HIDDEN_FRACTION = 0.25


@dataclass(frozen=True)
class TpPoints:
    """What was measured for one op at one TP size. Only the start TP needs none and nocomm."""
    best: MeasuredPoint | None = None        # best overlapped point (winner of the overlap search)
    none: MeasuredPoint | None = None        # collectives on, no overlap
    nocomm: MeasuredPoint | None = None      # collectives removed: the bound
    verdict: str | None = None      # trace analysis: "overlapped", "not overlapped", ...

    def fastest(self) -> MeasuredPoint | None:
        """The faster of best and none (none on a tie: the simpler setting)."""
        if self.best is None or self.none is None:
            return self.best if self.none is None else self.none
        return self.best if point_median(self.best) < point_median(self.none) else self.none

    def time_ms(self) -> float:
        return point_median(self.fastest())


def hides_communication(at: TpPoints, *, min_hidden_fraction: float = DEFAULT_MIN_HIDDEN_FRACTION,
                        trust_verdict: bool = True, floor: float = DEFAULT_FLOOR,
                        k: float = DEFAULT_K) -> dict:
    """Evidence record of the hiding rule (module doc); ``passed`` says whether it holds."""
    none, nocomm, best = (point_median(p) for p in (at.none, at.nocomm, at.best))
    exposed = none - nocomm
    vs_none = compare_points(at.best, at.none, floor=floor, k=k, tie="b")
    rec = {"rule": "hides_communication", "none_ms": _num(none), "nocomm_ms": _num(nocomm),
           "best_ms": _num(best), "exposed_ms": _num(exposed), "margin": vs_none.margin,
           "min_hidden_fraction": min_hidden_fraction, "verdict": at.verdict,
           "cases": [point_case(p) for p in (at.none, at.nocomm, at.best)],
           "comparison": vs_none.to_dict()}
    if none == INF or nocomm == INF:
        return {**rec, "hidden_fraction": None, "passed": False,
                "reason": "no-overlap or no-collective point failed: nothing to judge"}
    if best == INF:
        return {**rec, "hidden_fraction": None, "passed": False,
                "reason": "no overlapped setting was measured: nothing to judge"}
    bound_vs_none = compare_points(at.nocomm, at.none, floor=floor, k=k, tie="b")
    if bound_vs_none.outcome == 0 and bound_vs_none.resolved:
        return {**rec, "hidden_fraction": None, "passed": True,
                "reason": "no exposed communication: none is within the margin of nocomm"}
    if exposed <= 0 or bound_vs_none.outcome > 0:
        # no exposed communication to share out: a fault only where stats.bound.fault says so
        rec["hidden_fraction"] = None
        beats = vs_none.outcome < 0
        f = fault(at.nocomm, at.none, floor)
        why = ("bound fault: the no-collective bound reads slower than no overlap beyond the noise" if f else
               "the no-collective bound does not read below no overlap, nor above it beyond the noise: no exposed "
               "communication measured")
        return {**rec, "passed": beats, "reason": f"best overlapped setting {'beats' if beats else 'does not beat'} "
                f"no-overlap ({why}; no fraction computed)"}
    hidden = (none - best) / exposed if best != INF else 0.0
    eff = _efficiency(at)
    if eff is not None:   # paired rounds of one session: the report's definition (stats.efficiency)
        rec["efficiency"] = eff.to_dict()
        if eff.fault:
            return {**rec, "hidden_fraction": None, "passed": vs_none.outcome < 0,
                    "reason": f"{eff.shown()}: no fraction computed; the best overlapped setting "
                              f"{'beats' if vs_none.outcome < 0 else 'does not beat'} no overlap"}
        if eff.raw is not None:
            hidden = eff.raw
    rec["hidden_fraction"] = min(1.0, max(0.0, hidden))
    if vs_none.outcome >= 0:
        return {**rec, "passed": False, "reason": "best overlapped setting does not beat no-overlap"}
    if hidden < min_hidden_fraction:
        return {**rec, "passed": False,
                "reason": f"{_hides(eff, hidden)} < {min_hidden_fraction:.0%}"}
    if trust_verdict and _normalize(at.verdict) == "not overlapped":
        return {**rec, "passed": False, "reason": "trace analysis: not overlapped"}
    return {**rec, "passed": True, "reason": _hides(eff, hidden)}


def _efficiency(at: TpPoints):
    eff = op_efficiency(at.none, at.best, at.nocomm)
    return eff if (eff.rounds >= 2 or eff.fault) else None


def _hides(eff, hidden: float) -> str:
    """The efficiency's words (stats.efficiency); from medians only where no paired rounds exist."""
    if eff is not None:
        return eff.hides()
    if hidden >= 1:
        return "hides all exposed communication (by medians: the best setting reads at or below its bound)"
    return f"hides {max(0.0, hidden):.0%} of exposed communication (by medians)"


def tp_next(op: str, measured_by_tp: dict[int, TpPoints], **rules) -> int | None:
    """The TP size to measure next for ``op``, or None when the decision is made.
    ``rules``: start_tp, gpus_per_node, allowed_tps, tolerance, min_hidden_fraction,
    trust_verdict, floor, k (module doc)."""
    nxt, _, _ = _replay(op, measured_by_tp, **rules)
    return nxt


def tp_result(op: str, measured_by_tp: dict[int, TpPoints], **rules) -> tuple[int, list[dict]]:
    """(chosen TP, evidence records in decision order). Raises ValueError while a TP is missing."""
    nxt, chosen, evidence = _replay(op, measured_by_tp, **rules)
    if nxt is not None:
        raise ValueError(f"{op}: TP decision not finished: measure TP={nxt} next")
    return chosen, evidence


def _replay(op, measured, *, start_tp=DEFAULT_START_TP, gpus_per_node=DEFAULT_GPUS_PER_NODE,
            allowed_tps=None, tolerance=DEFAULT_TOLERANCE,
            min_hidden_fraction=DEFAULT_MIN_HIDDEN_FRACTION, trust_verdict=True,
            floor=DEFAULT_FLOOR, k=DEFAULT_K):
    evidence = []
    if not _fits(start_tp, gpus_per_node, allowed_tps):
        evidence.append(_node_bound(op, start_tp, gpus_per_node, allowed_tps))
        return None, 1, evidence
    at = measured.get(start_tp)
    if at is None or at.none is None or at.nocomm is None or at.best is None:
        return start_tp, None, evidence
    hide = hides_communication(at, min_hidden_fraction=min_hidden_fraction,
                               trust_verdict=trust_verdict, floor=floor, k=k)
    evidence.append({**hide, "op": op, "tp": start_tp})
    if not hide["passed"]:
        return None, 1, evidence
    nxt, chosen, chain = scaling_chain(op, measured, start_tp, gpus_per_node=gpus_per_node,
                                       allowed_tps=allowed_tps, tolerance=tolerance)
    return nxt, chosen, evidence + chain


def scaling_chain(op: str, measured: dict[int, TpPoints], start_tp: int, *, gpus_per_node=DEFAULT_GPUS_PER_NODE,
                  allowed_tps=None, tolerance=DEFAULT_TOLERANCE) -> tuple[int | None, int | None, list[dict]]:
    """The scaling steps from ``start_tp`` on (module doc), as if the start TP had passed: (the TP to
    measure next or None, the chosen TP or None while one is missing, the steps' evidence). The rule runs
    it after a passed hiding test; decide.tp also after an undecided one, where the next TP was measured."""
    evidence, tp = [], start_tp
    while True:
        nxt = tp * 2
        if not _fits(nxt, gpus_per_node, allowed_tps):
            evidence.append(_node_bound(op, nxt, gpus_per_node, allowed_tps))
            return None, tp, evidence
        here, there = measured[tp], measured.get(nxt)
        if there is None or (there.best is None and there.none is None):
            return nxt, None, evidence
        t_from, t_to = here.time_ms(), there.time_ms()
        bound = t_from / 2 * (1 + tolerance)
        passed = t_to <= bound
        evidence.append({"rule": "scaling", "op": op, "from_tp": tp, "to_tp": nxt,
                         "time_from_ms": _num(t_from), "time_to_ms": _num(t_to), "bound_ms": _num(bound),
                         "tolerance": tolerance, "passed": passed,
                         "cases": [point_case(here.fastest()), point_case(there.fastest())]})
        if not passed:
            return None, tp, evidence
        tp = nxt


def _fits(tp: int, gpus_per_node: int, allowed_tps) -> bool:
    return tp <= gpus_per_node and (allowed_tps is None or tp in allowed_tps)


def _node_bound(op: str, tp: int, gpus_per_node: int, allowed_tps) -> dict:
    """The evidence that ``tp`` is beyond the node (or not among the TP sizes allowed)."""
    return {"rule": "node_bound", "op": op, "tp": tp, "passed": False, "gpus_per_node": gpus_per_node,
            "allowed_tps": _list(allowed_tps)}


def _normalize(verdict: str | None) -> str | None:
    return None if verdict is None else " ".join(verdict.lower().replace("_", " ").replace("-", " ").split())


def _num(x: float) -> float | None:
    return None if x in (INF, -INF) or x != x else x


def _list(xs):
    return None if xs is None else sorted(xs)
