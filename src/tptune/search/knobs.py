"""Freeze-or-bisect search over the userbuffers knobs of one op at one TP (issue 12). Pure functions
over measured points: no Snakemake, no I/O.

The search starts from the best of the reference configs (TE defaults and every NVIDIA preset for
the TP, measured side by side in one session), so its answer is never worse than a reference beyond
the noise. Then, one knob group at a time (methods.KNOB_DEFAULTS["groups"]), per GEMM of the op:
- a group's values (incumbent included) are measured side by side in one session; the fastest and
  every value that ties with it beyond the noise margin (noise.compare_points) form the tie set,
  and the cheapest value of the tie set is kept. A knob that moves nothing is thereby frozen at its
  cheapest value (fewest SMs, copy engine, no margin, ...);
- unimodal groups (num_sm, num_splits) are bisected (bisect.next_points/result with ``pairs=``: each
  step's two values are one session), then the bisection's value and the incumbent are compared in
  one confirmation session, cheaper on a tie;
- the two bulk GEMMs of a column op (dgrad hides wgrad's all-gather, wgrad hides dgrad's
  reduce-scatter, and both take SMs from the same GEMMs) are searched jointly: a compared group
  measures the product of both GEMMs' values, a bisected group bisects each GEMM then confirms the
  2x2 corners (old/new of each) in one session.

Why per group is enough: a knob acts on one GEMM's communicator (its own streams, SMs, buffer), and
the GEMMs of one op run one after another (fprop, then dgrad, then wgrad), so their times add up and
one GEMM's knob cannot move another GEMM's time, except where two GEMMs run at once: the bulk
dgrad/wgrad pair of a column op (searched jointly, above) and the atomic ring_exchange pairs, which
span two ops and are compared on the block (methods.atomic_pair_candidates). Within a GEMM the
groups are ordered so a group decides whether the later ones matter (method resets the knobs, then
use_ce and set_sm_margin decide whether num_sm/cga_size are read), and a group is compared against
the current incumbent, so a later choice never undoes an earlier gain beyond the noise.

State is nothing but measurements: ``measured`` maps a session label to {case id: point}; every call
replays the search from the start (like bisect), and a session whose members changed is asked again.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from tptune.cases import Variant, make_case, make_override
from tptune.model.ops import COLUMN_OPS, OP_GEMMS
from tptune.search import bisect
from tptune.stats.noise import DEFAULT_FLOOR, compare_points
from tptune.stats.rounds import center
from tptune.te.methods import (
    UNIMODAL_GROUPS,
    current_value,
    gemm_knob_values,
    knob_config,
    with_knob,
)
from tptune.te.ubcfg import validate_ub_cfgs


@dataclass(frozen=True)
class Session:
    """Settings to measure side by side: ``members`` are case ids (each reproduces its ub_cfgs)."""
    label: str
    members: tuple[str, ...]


@dataclass
class SearchResult:
    cfgs: dict                       # the chosen ten-GEMM ub_cfgs
    case: str                        # its case id
    reference: str                   # the best reference
    path: list = field(default_factory=list)
    sessions: list = field(default_factory=list)   # every Session the search needed
    # the best setting of the other dgrad mode (a column op: bulk vs reduce-scatter), as its case id:
    # Megatron's tp_comm_overlap_rs_dgrad is one switch for qkv and fc1, so the layer stage may need it
    alternative: str | None = None

    @property
    def measurements(self) -> int:
        return sum(len(s.members) for s in self.sessions)


class _Need(Exception):
    def __init__(self, session: Session):
        self.session = session


def setting_case(op: str, tp: int, cfgs: dict) -> str:
    """Case id whose ub_cfgs equals ``cfgs`` on ``op``'s GEMMs: TE defaults plus a full override of
    each of the op's GEMMs (every knob spelled out, so ubcfg.case_ub_cfgs reproduces it)."""
    ovs = []
    for gemm in OP_GEMMS[op]:
        if f"{op}_{gemm}" not in cfgs:      # a wgrad beside a reduce-scatter dgrad: TE drops it too
            continue
        e = cfgs[f"{op}_{gemm}"]
        ovs.append(make_override(gemm, e["method"], **{k: v for k, v in e.items() if k != "method"}))
    return make_case(op, tp, Variant("ub", preset="te", overrides=tuple(ovs))).id


def plan_next(op: str, tp: int, references: dict[str, dict], measured: dict, config: dict | None = None,
              *, workload: str = "bf16", floor: float = DEFAULT_FLOOR, win: float | None = None) -> Session | None:
    """The next session to measure, or None when the search is done. ``win``: the margin a knob value
    wins beyond in its session (decision.step_margin; ties still within ``floor``)."""
    try:
        _replay(op, tp, references, measured, config, workload, floor, win)
    except _Need as need:
        return need.session
    return None


def plan_result(op: str, tp: int, references: dict[str, dict], measured: dict, config: dict | None = None,
                *, workload: str = "bf16", floor: float = DEFAULT_FLOOR, win: float | None = None) -> SearchResult:
    """The finished search; ValueError while a session is still missing."""
    try:
        return _replay(op, tp, references, measured, config, workload, floor, win)
    except _Need as need:
        raise ValueError(f"search not finished: measure session {need.session.label} next") from None


def _replay(op, tp, references, measured, config, workload, floor, win=None):
    cfg = knob_config(config)
    if not references:
        raise ValueError("no reference configs to start from")
    for name, c in references.items():
        validate_ub_cfgs(c, source=f"reference {name}", workload=workload)
    res = SearchResult({}, "", "")

    def session(label, members):
        s = Session(label, tuple(members))
        res.sessions.append(s)
        pts = measured.get(label) or {}
        if any(m not in pts for m in s.members):
            raise _Need(s)
        return pts

    def pick(label, options):
        """options: [(value, cfgs)] cheapest first -> the cheapest value tying with the fastest."""
        ids = {}
        for v, c in options:
            ids.setdefault(setting_case(op, tp, c), (v, c))
        pts = session(label, ids)
        order = list(ids)
        fastest = min(order, key=lambda i: center(pts[i]))
        keep = next(i for i in order if i == fastest or compare_points(pts[i], pts[fastest], floor=floor,
                                                                          tie="a", win=win).winner == "a")
        res.path.append({"session": label, "compared": order, "kept": keep})
        return ids[keep]

    # 1. the best reference (given cheapest first; a later one must win beyond the noise)
    ref_ids = {setting_case(op, tp, c): n for n, c in references.items()}
    pts = session("refs", ref_ids)
    best = next(iter(ref_ids))
    for i in ref_ids:
        if i != best and compare_points(pts[i], pts[best], floor=floor, tie="b").winner == "a":
            best = i
    res.reference = ref_ids[best]
    inc = {k: dict(v) for k, v in references[ref_ids[best]].items()}
    res.path.append({"session": "refs", "compared": list(ref_ids), "kept": best})

    bulk_pair = [f"{op}_dgrad", f"{op}_wgrad"] if op in COLUMN_OPS else []
    for group in cfg["groups"]:
        joint_done = False
        for gemm in OP_GEMMS[op]:
            name = f"{op}_{gemm}"
            if name not in inc:
                continue
            if group == "rs_dgrad":
                vals = _values(name, inc, group, config, workload)
                if len(vals) > 1:
                    options = [(v, with_knob(inc, name, group, v)) for v in vals]
                    kept, inc = pick(f"{group}:{name}", options)
                    res.alternative = next(setting_case(op, tp, c) for v, c in options if v != kept)
                continue
            if name in bulk_pair and all(inc.get(g, {}).get("method") == "bulk" for g in bulk_pair):
                if joint_done:
                    continue
                joint_done = True
                inc = _joint(op, tp, group, bulk_pair, inc, cfg, config, workload, (win, floor), session, pick,
                             measured)
                continue
            vals = _values(name, inc, group, config, workload)
            if len(vals) < 2:
                continue
            if group in UNIMODAL_GROUPS:
                best_v = _bisect(op, tp, group, name, inc, vals, measured, (win, floor), session)
                cur = current_value(inc[name], group)
                opts = sorted({cur, best_v}, key=lambda v: vals.index(v) if v in vals else len(vals))
                _, inc = pick(f"{group}:{name}:confirm", [(v, with_knob(inc, name, group, v)) for v in opts])
            else:
                _, inc = pick(f"{group}:{name}", [(v, with_knob(inc, name, group, v)) for v in vals])
    res.cfgs = inc
    res.case = setting_case(op, tp, inc)
    return res


def _values(name, inc, group, config, workload):
    """Candidate values valid on the incumbent; the incumbent's own value included (cheapest first)."""
    vals = []
    for v in gemm_knob_values(name, inc[name], group, config, workload):
        try:
            validate_ub_cfgs(with_knob(inc, name, group, v), workload=workload)
        except ValueError:
            continue
        vals.append(v)
    cur = current_value(inc[name], group)
    if vals and cur not in vals and group not in UNIMODAL_GROUPS:
        vals.append(cur)
    return vals


def _bisect(op, tp, group, name, inc, vals, measured, margins, session):
    win, floor = margins          # as settings.step_margins gives them
    pairs = {}
    while True:
        todo = bisect.next_points(vals, {}, floor=floor, pairs=pairs, win=win)
        if not todo:
            return bisect.result(vals, {}, floor=floor, pairs=pairs, win=win)[0]
        left, right = todo
        cl, cr = (setting_case(op, tp, with_knob(inc, name, group, v)) for v in (left, right))
        pts = session(f"{group}:{name}:{left}-{right}", [cl, cr])
        pairs[(left, right)] = (pts[cl], pts[cr])


def _joint(op, tp, group, pair, inc, cfg, config, workload, margins, session, pick, measured):
    d, w = pair
    vd, vw = (_values(g, inc, group, config, workload) for g in pair)
    if len(vd) < 2 and len(vw) < 2:
        return inc
    vd, vw = vd or [current_value(inc[d], group)], vw or [current_value(inc[w], group)]
    if group in UNIMODAL_GROUPS:
        bd = _bisect(op, tp, group, d, inc, vd, measured, margins, session) if len(vd) > 1 else vd[0]
        bw = _bisect(op, tp, group, w, inc, vw, measured, margins, session) if len(vw) > 1 else vw[0]
        cd, cw = current_value(inc[d], group), current_value(inc[w], group)
        grid = [(a, b) for a in dict.fromkeys(sorted({cd, bd})) for b in dict.fromkeys(sorted({cw, bw}))]
        label = f"{group}:{d}+{w}:confirm"
    else:
        grid = list(itertools.product(vd, vw))
        label = f"{group}:{d}+{w}"
    opts = [((a, b), with_knob(with_knob(inc, d, group, a), w, group, b)) for a, b in grid]
    if group in UNIMODAL_GROUPS:
        opts.sort(key=lambda o: (sum(o[0]), o[0]))      # fewer SMs / splits in all first
    _, new = pick(label, opts)
    return new
