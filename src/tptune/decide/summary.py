"""What the report says of the measurement itself: drift canary, session noise, host-bound and
host-behind settings, stepped batches, the block's host evidence, the capped efficiency of the model."""
from __future__ import annotations

from tptune.decide.tp_point import STEP_FACTOR
from tptune.records.layer_result import LayerResult
from tptune.records.sessions import Session
from tptune.stats import session_noise
from tptune.stats.efficiency import model_efficiency
from tptune.stats.rounds import drift


def summed_efficiency(records: dict, points_by_op: dict) -> dict:
    """The capped efficiency of the summed ops (stats.efficiency.model_efficiency), each op at the TP
    its evidence was taken."""
    triples = {}
    for op, rec in records.items():
        pts = points_by_op[op]
        tp = rec["tp"] if rec["tp"] in pts else min(pts)
        p = pts[tp]
        cands = {c.case: c for c in [p.get("none"), *p["candidates"].values()] if c}
        win = cands.get((rec.get("winner") or {}).get("case"))
        triples[op] = (p.get("none"), win, p.get("nocomm"))
    return model_efficiency(triples).to_dict()


def block_host_warning(measurement: dict, layer: dict[int, LayerResult]) -> None:
    """The report's host warning covers block sessions: settings of the block whose batches never got the
    host ahead, counted, and block batches whose host-ahead verdict was recorded without its figures."""
    behind, unproven = [], []
    for rec in layer.values():
        for row in rec.settings:
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


def measurement_summary(sessions: list[Session], points_by_op: dict, floor: float, device: str = "cuda") -> dict:
    """How far the run's measurements can be trusted: the drift canary over the run (one reference
    re-measured at every session's start), the noise of rounds within sessions against what the round
    budget can resolve (stats.session_noise), bound faults, ops whose host launch time reaches their
    GPU time, and batches where the host did not stay ahead. ``device`` names the remedy (cuda | cpu)."""
    canaries = []
    for sess in sessions:
        c = sess.record.get("canary")
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
        warnings.append(f"machine noise: the drift canary moved {worst:.1%} over the run (max/min − 1 of its "
                        f"times: its slowest {1 + worst:.2f}× its fastest), more than the "
                        f"{floor:.0%} margin. Decisions inside one session compare rounds side by side and "
                        f"are unaffected; comparisons across sessions (TP sizes) are less certain than their "
                        f"intervals say.")
    rounds_noise = session_noise.op_noise(sessions)
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
