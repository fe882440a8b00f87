"""The packed block sessions (issue 53, docs/packing.md): at which TP, at which capacities T, with which settings,
and the native-batching points measured beside them.

After the run's decisions (decisions.json: the model TP; layer/tp<N>.json: what its block measured), one session
per capacity T (sessions/layer/tp<N>/pack<T>) times the block on packed THD input in alternating rounds:

- at T, one fill-to-capacity bin of the user's lengths (bin 0, ``session_spec.fill_bins``: the bin that stands for
  a step's bins), padded to T: no overlap, the run's written set (te: the block-level winner written as
  ``tp_comm_overlap_cfg.tp<N>.yaml``, the tuned combination ``ub.tuned_tp<N>`` unless a reference beat it; torch:
  the block's chunked setting) and, on te, the fastest NVIDIA preset of ``search.te_presets`` the block measured;
- no overlap at a few native micro-batches (bins 1, 2, ...: the framework's own micro-batches, ``rule``, nearest the
  ``NATIVE_QUANTILES`` of their token counts, each at its own token count rounded up to the capacity multiple), for
  the no-overlap fit of setup (a) of packing.decide. In the same rounds as the capacity's, so every ratio against
  the native batching is paired by round.

Which TP: the model TP where its block was measured, else the smallest TP >= 2 whose block was (a run whose
model TP is 1 still gets its packed answer at a TP that has overlap), else none: the stage has nothing to measure.

The measurement settings of a packed session (``packed_measurement``) are the layer stage's (search.measurement)
with the bins and the native points: the workflow's params, so a change to the lengths, the rule, the budget, the
steps, the seed or the capacities re-measures exactly the packed sessions; its members follow from the layer
record (the job's input), as the layer stage's follow from the TP points.
"""
from __future__ import annotations

import json
from dataclasses import replace

import numpy as np

from tptune.cases import Case, make_case, parse_case_id
from tptune.measure.session_spec import fill_bins
from tptune.packing.capacity import multiple
from tptune.packing.rules import round_up
from tptune.packing.spec import PackingSpec
from tptune.records.run_dir import packed_session_name
from tptune.search.measurement import MEMBER_KEYS, measurement
from tptune.settings.resolve import Settings

NATIVE_QUANTILES = (0.05, 0.5, 0.95)   # of the native micro-batches' token counts: the fit's points
CAPACITY_BIN = 0                       # the fill bin at T; the native points' bins are 1, 2, ...


def packing_spec(s: Settings) -> PackingSpec | None:
    return PackingSpec.from_config(s.config)


def packing_tp(model_tp, layer_tps) -> tuple[int | None, str]:
    """(the TP the packed sessions measure at, why) from the model TP and the TPs whose block was measured."""
    tps = sorted(int(t) for t in layer_tps)
    if isinstance(model_tp, int) and model_tp >= 2 and model_tp in tps:
        return model_tp, f"the model TP ({model_tp})"
    cands = [t for t in tps if t >= 2]
    if not cands:
        return None, ("no TP of 2 or more had its block measured (the layer stage), so there is no overlap to pad "
                      "micro-batches for")
    why = ("the model TP is 1: without TP nothing is overlapped" if model_tp == 1 else
           f"the model TP ({model_tp!r}) has no measured block")
    return cands[0], f"{why}; TP {cands[0]} is the smallest TP whose block was measured"


def capacities(s: Settings, spec: PackingSpec, lengths: np.ndarray, tp: int) -> list[int]:
    w = s.model.workload
    return spec.capacities_for(lengths, tp, w.is_fp8, w.recipe)


def native_points(s: Settings, spec: PackingSpec, lengths: np.ndarray, tp: int) -> list[tuple[int, list[int]]]:
    """[(tokens, lengths)]: the native micro-batches the fit is measured at, ascending, distinct token counts
    (module doc). Rule fill pads every bin to max_token_len: one point (a fit of degree 0)."""
    w = s.model.workload
    m = multiple(tp, w.is_fp8, w.recipe)
    mbs = [mb for st in spec.native_steps(lengths, tp, w.is_fp8) for mb in st.micro_batches]
    tokens = np.array([mb.padded for mb in mbs], dtype=np.int64)
    out: dict[int, list[int]] = {}
    for q in NATIVE_QUANTILES:
        i = int(np.argmin(np.abs(tokens - np.quantile(tokens, q))))
        t = round_up(int(tokens[i]), m)
        out.setdefault(t, [int(x) for x in mbs[i].lengths])
    return sorted(out.items())


def session_bins(spec: PackingSpec, lengths: np.ndarray, capacity: int,
                 native: list[tuple[int, list[int]]]) -> tuple[dict[str, list[int]], list[tuple[int, int]]]:
    """(layer.bins of the session at ``capacity``, [(tokens, bin id)] of its native points); ``native``:
    native_points, the same for every capacity."""
    bins = fill_bins(lengths, capacity, ids=(CAPACITY_BIN,), seed=spec.seed)
    points = []
    for k, (t, ls) in enumerate(native, start=CAPACITY_BIN + 1):
        bins[str(k)] = list(ls)
        points.append((t, k))
    return bins, points


def packed_measurement(s: Settings, tp: int, capacity: int, spec: PackingSpec, lengths: np.ndarray,
                       native: list[tuple[int, list[int]]] | None = None) -> dict:
    """A packed session's measurement settings (module doc); members None: they follow from the layer record.
    ``native``: native_points at ``tp`` where the caller has them (they take a packing of every step)."""
    native = native_points(s, spec, lengths, tp) if native is None else native
    bins, points = session_bins(spec, lengths, capacity, native)
    op = replace(s.op(s.ops[0]), check=True)
    m = measurement(s, op, None, canary=None, margin=s.decision.noise_floor, tie_margin=None, evidence=True,
                    layer={**s.layer.block_settings(), "bins": bins})
    # the numerics check of every member's first round (the set on packed input computes as no overlap does),
    # without profiler traces: nothing reads a packed session's
    return m | {"profile": False, "packing": {"capacity": capacity, "native": [list(x) for x in points], "rule": spec.rule,
                            **({"presets": list(s.search.te_presets or [])} if s.backend == "te" else {})}}


def settings_of(layer_record: dict, s: Settings) -> dict[str, str | None]:
    """{"set": the written set's block variant, "preset": the fastest NVIDIA preset's (te; None where none ran)}
    from the layer stage's record at the TP (layer/tp<N>.json)."""
    rows = [r for r in layer_record.get("settings") or [] if isinstance(r, dict)]
    if s.backend == "te":
        winner = layer_record.get("winner") or layer_record.get("tuned")
        v = parse_case_id(winner).variant if winner else None
        chosen = winner if v is not None and v.overlapped and v.kind == "ub" else layer_record.get("tuned")
        presets = set(s.search.te_presets or [])
        ran = [r for r in rows if r.get("status") == "ok" and r.get("median_ms")
               and r.get("variant", "").startswith("ub.") and r["variant"][3:] in presets
               and not r.get("environment")]
        best = min(ran, key=lambda r: r["median_ms"])["variant"] if ran else None
        set_v = parse_case_id(chosen).variant_id
        return {"set": set_v, "preset": best if best != set_v else None}
    chunked = [r["variant"] for r in rows if str(r.get("variant", "")).startswith("chunked")]
    if not chunked:
        tuned = parse_case_id(layer_record["tuned"]).variant_id
        chunked = [tuned] if tuned.startswith("chunked") else []
    if not chunked:
        raise ValueError(f"layer/tp{layer_record.get('tp')}.json: no chunked setting measured on the block")
    return {"set": chunked[0], "preset": None}


def capacity_cases(tp: int, capacity: int, settings: dict[str, str | None]) -> dict[str, Case]:
    """{"none", "set", ["preset"]}: the cases at T, each on bin 0."""
    pack = f"pack{capacity}.b{CAPACITY_BIN}"
    out = {"none": make_case("layer", tp, "none", pack), "set": make_case("layer", tp, settings["set"], pack)}
    if settings.get("preset"):
        out["preset"] = make_case("layer", tp, settings["preset"], pack)
    return out


def native_cases(tp: int, native: list) -> dict[int, Case]:
    """{tokens: the no-overlap case at that native micro-batch}."""
    return {int(t): make_case("layer", tp, "none", f"pack{int(t)}.b{int(k)}") for t, k in native}


def session_members(tp: int, m: dict, settings: dict[str, str | None]) -> tuple[list[Case], list[str], list[str]]:
    """(the members, the contenders, the members measured every round) of the packed session measured with ``m``
    (packed_measurement): the capacity's settings contend; no overlap (a reference) and the set every round, and
    the native points (references too), so every ratio the decision takes is paired over all rounds."""
    cap = capacity_cases(tp, m["packing"]["capacity"], settings)
    nat = native_cases(tp, m["packing"]["native"])
    members = list(dict.fromkeys([*cap.values(), *nat.values()]))
    return members, [c.id for c in cap.values()], [cap["set"].id]


def plan_record(s: Settings, tp: int | None, why: str, caps: list[int], settings: dict | None) -> dict:
    """packing/plan.json: what the packed sessions measure (the workflow reads the TP and the capacities)."""
    return {"tp": tp, "why": why, "capacities": caps if tp else [], "settings": settings,
            "sessions": [packed_session_name(tp, c) for c in caps] if tp else []}


FORWARD_ONLY_SHARE = 1 / 3    # a packed round also times the forward alone: about a third of fwd+bwd


def planned(s: Settings, base_dir=".") -> tuple[int | None, list[tuple[int, list[int]]], str | None]:
    """Before anything is measured (schedule.plan_estimate): (the TP the packed sessions are counted at, [(T, each
    member's tokens)], a note on what was assumed), or (None, [], None) for a run without them. The TP is known
    only after the decisions: counted at the largest of tp_sizes (at least 2). Lengths that do not read from
    ``base_dir`` leave the capacities given (or the budget and twice it) and three native points at the budget."""
    spec = packing_spec(s)
    tps = [t for t in s.tp_sizes if t >= 2]
    if spec is None or not s.layer.enabled or not tps:
        return None, [], None
    tp = max(tps)
    settings = 2 + int(s.backend == "te" and bool(s.search.te_presets))    # none, the set[, the best preset]
    try:
        lengths = spec.load(base_dir)
        caps, native = capacities(s, spec, lengths, tp), [t for t, _ in native_points(s, spec, lengths, tp)]
        note = None
    except Exception as exc:  # noqa: BLE001 - a prediction never stops planning (the lengths are validated apart)
        caps = list(spec.capacities or (spec.max_token_len, 2 * spec.max_token_len))
        native = [spec.max_token_len] * len(NATIVE_QUANTILES)
        note = f"the packing lengths did not read here ({type(exc).__name__}): the packed sessions counted roughly"
    return tp, [(c, [c] * settings + native) for c in caps], note


def settings_unchanged(s: Settings, name: str, recorded: dict | None, base_dir=".") -> bool:
    """search.measurement.settings_unchanged for a packed session (layer/tp<N>/pack<T>): its recorded measurement
    settings are those the run config gives it now, its members aside."""
    spec = packing_spec(s)
    parts = name.split("/")
    if spec is None or not isinstance(recorded, dict) or len(parts) != 3:
        return False
    try:
        now = packed_measurement(s, int(parts[1][2:]), int(parts[2][4:]), spec, spec.load(base_dir))
    except (ValueError, OSError):
        return False
    strip = (lambda m: {k: v for k, v in m.items() if k not in MEMBER_KEYS})
    return strip(json.loads(json.dumps(now, default=str))) == strip(recorded)
