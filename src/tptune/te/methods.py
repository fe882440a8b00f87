"""Candidate overlap settings per GEMM: what the search measures for one op at one TP.

TE backend, per GEMM "<op>_<gemm>" (methods from the config that TE allows there, see
ubcfg.allowed_methods):
- ring_exchange by default for the all-gather/reduce-scatter GEMMs (column fprop, row fprop, row
  dgrad): a fixed setting, the copy engine moves the data, so there is no SM count to search.
- bulk for column dgrad/wgrad: its comm SM count is searched (bisect over ``num_sm``).
- pipeline (row fprop only) only when the config lists it (``pipeline: true`` or in
  ``te_methods.fprop``): the seed sees no point in a pipelined reduce-scatter that takes SMs
  from the GEMM; when listed, its SM count is searched too.
Torch backend: the chunk counts of the chunked variant (bisect over ``chunks``).

Config keys (all optional): te_methods {fprop, dgrad, wgrad: [method, ...]}, num_sm [ints],
pipeline (bool), chunks [ints], cga_size (int), set_sm_margin (0/1) for the SM-searched methods
(unset: the preset's value stays).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

from tptune.cases import METHODS, Case, GemmOverride, Variant, make_case, make_override
from tptune.model.ops import COLUMN_OPS, OP_GEMMS
from tptune.te.ubcfg import (ATOMIC_PAIRS, KNOB_RANGES, METHOD_DEFAULTS, TE_COMM_PRIORITY, TE_GEMM_PRIORITY,
                             allowed_methods, merge_entry, te_default_ub_cfgs, validate_ub_cfgs)

DEFAULT_CONFIG = {
    "te_methods": {"fprop": ["ring_exchange"], "dgrad": ["ring_exchange", "bulk"], "wgrad": ["bulk"]},
    "num_sm": [1, 2, 4, 8, 16, 24, 32],
    "pipeline": False,
    "chunks": [2, 4, 8],
}
SM_SEARCHED = ("bulk", "pipeline")


@dataclass(frozen=True)
class GemmPlan:
    """One method for one GEMM: fixed knobs, and the SM counts to search (empty: nothing to search)."""
    op: str
    tp: int
    gemm: str
    method: str
    knobs: tuple[tuple[str, int], ...] = ()
    sm_candidates: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.op}_{self.gemm}"

    def override(self, num_sm: int | None = None) -> GemmOverride:
        knobs = dict(self.knobs)
        if num_sm is not None:
            knobs["num_sm"] = num_sm
        return make_override(self.gemm, self.method, **knobs)

    def case(self, num_sm: int | None = None, preset: str = "te") -> Case:
        """The case measuring this plan (at ``num_sm`` when its SM count is searched)."""
        return make_case(self.op, self.tp, Variant("ub", preset=preset, overrides=(self.override(num_sm),)))

    def cases(self, preset: str = "te") -> dict[int | None, Case]:
        """Case per SM candidate, in search order ({None: case} for a fixed setting)."""
        return {sm: self.case(sm, preset) for sm in (self.sm_candidates or (None,))}


def te_candidates(op: str, tp: int, config: dict | None = None) -> dict[str, list[GemmPlan]]:
    """Per GEMM of ``op`` ("fprop", "dgrad", ["wgrad"]): its plans, cheapest method first
    (ring_exchange, bulk, pipeline). ``te_methods`` entries the config leaves out keep the defaults.
    Raises ValueError naming the config key when no method the config allows is valid for a GEMM."""
    cfg = _config(config)
    te_methods = cfg["te_methods"]
    sms = tuple(_ints(cfg["num_sm"], "num_sm", *KNOB_RANGES["num_sm"]))
    fixed = tuple((k, int(cfg[k])) for k in ("cga_size", "set_sm_margin") if cfg.get(k) is not None)
    out = {}
    for gemm in OP_GEMMS[op]:
        wanted = [METHODS.get(m, m) for m in te_methods.get(gemm, [])]
        unknown = [m for m in wanted if m not in METHODS.values()]
        if unknown:
            raise ValueError(f"te_methods.{gemm}: unknown method(s) {unknown} "
                             f"(expected {', '.join(METHODS.values())})")
        if cfg["pipeline"] and gemm == "fprop":
            wanted.append("pipeline")
        allowed = allowed_methods(f"{op}_{gemm}")
        methods = [m for m in ("ring_exchange", "bulk", "pipeline") if m in wanted and m in allowed]
        if not methods:
            raise ValueError(f"te_methods.{gemm}: {wanted or 'nothing'} allowed for {op}_{gemm}, "
                             f"but TE supports only {' or '.join(allowed)} there")
        out[gemm] = [GemmPlan(op, tp, gemm, m, fixed if m in SM_SEARCHED else (),
                              sms if m in SM_SEARCHED else ()) for m in methods]
    return out


def chunk_candidates(config: dict | None = None) -> list[int]:
    """Chunk counts of the torch backend's chunked variant, ascending (default [2, 4, 8])."""
    return _ints(_config(config)["chunks"], "chunks", 2, 64)


def _config(config: dict | None) -> dict:
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    if isinstance(cfg["te_methods"], dict):
        cfg["te_methods"] = {**DEFAULT_CONFIG["te_methods"], **cfg["te_methods"]}
    unknown = set(cfg) - set(DEFAULT_CONFIG) - {"cga_size", "set_sm_margin"}
    if unknown:
        raise ValueError(f"search config: unknown key(s) {sorted(unknown)}")
    if not isinstance(cfg["te_methods"], dict) or set(cfg["te_methods"]) - {"fprop", "dgrad", "wgrad"}:
        raise ValueError("te_methods: expected a mapping with keys among fprop, dgrad, wgrad")
    for k in ("cga_size", "set_sm_margin"):
        if cfg.get(k) is not None:
            _ints([cfg[k]], k, *KNOB_RANGES[k])
    return cfg


def _ints(values, key: str, lo: int, hi: int) -> list[int]:
    """Sorted, distinct ints in [lo, hi]; ValueError naming ``key`` otherwise."""
    if not isinstance(values, (list, tuple)) or not values:
        raise ValueError(f"{key}: expected a non-empty list of integers, got {values!r}")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi]
    if bad:
        raise ValueError(f"{key}: {bad} not integers in [{lo}, {hi}]")
    return sorted(set(values))


# ---------------------------------------------------------------------------------------------
# Candidate values per knob group (issue 12): every knob TE 2.20 honours, per GEMM of an op.
# ---------------------------------------------------------------------------------------------
ALL_GROUPS = ("method", "rs_dgrad", "use_ce", "set_sm_margin", "num_sm", "cga_size", "num_splits", "aggregate",
              "pipeline_rs_overlap_first_gemm", "fp8_buf", "priority")
# The default groups (`search.knobs.groups: proven`) are those a stated rule keeps over every committed knob
# run (tptune.search.knob_rule: a group's kept / incumbent ratios pooled over its knob sessions, its 95%
# interval entirely below 1 - the step margin), read from the committed record of that derivation,
# tptune/data/knob_groups.json, which `python benchmarks/knob_evidence.py --write` writes from results/ and
# tests/search/test_knob_rule.py holds to it. No figure is copied here: that script prints each group's pooled
# ratio, and docs/knob-search.md quotes them from the record. `search.knobs.groups: all` searches every group.
PROVEN_GROUPS = tuple(json.loads(resources.files("tptune").joinpath("data", "knob_groups.json").read_text())["default"])
GROUP_SETS = {"proven": PROVEN_GROUPS, "all": ALL_GROUPS}
KNOB_DEFAULTS = {
    "groups": list(PROVEN_GROUPS),
    # qkv/fc1 dgrad: 0 = bulk (dgrad hides wgrad's all-gather, wgrad hides dgrad's reduce-scatter),
    # 1 = a ring-exchange reduce-scatter inside the dgrad GEMM, wgrad not overlapped (Megatron's
    # tp_comm_overlap_rs_dgrad). Pipeline is left out: on 2xH200 (TE 2.20.2, bf16) a pipelined
    # dgrad reduce-scatter failed the numerics check on the op and on the block (results/rs-dgrad-x2).
    "rs_dgrad": [0, 1],
    "num_sm": [1, 2, 4, 8, 16, 24, 32],
    "cga_size": [1, 2, 4],
    "set_sm_margin": [0, 1],
    "num_splits": [2, 4, 8],
    "aggregate": [0, 1],
    "use_ce": [1, 0],
    "pipeline_rs_overlap_first_gemm": [0, 1],
    "fp8_buf": [0, 1],
    # (comm_priority, gemm_priority): TE's default first; (0, 0) is TE's default again in C++
    "priority": [[-5, 0], [-5, -5], [0, -5]],
}
UNIMODAL_GROUPS = ("num_sm", "num_splits")      # bisected; the other groups are compared at once
GROUP_KNOBS = {g: (g,) for g in ALL_GROUPS}
GROUP_KNOBS["priority"] = ("comm_priority", "gemm_priority")
_AG_RING = ("qkv_fprop", "fc1_fprop", "proj_dgrad", "fc2_dgrad")   # all-gather ring exchanges


def knob_config(config: dict | None = None) -> dict:
    """The ``knobs`` config section over KNOB_DEFAULTS, checked (ValueError naming the key)."""
    R = {**KNOB_RANGES, "rs_dgrad": (0, 1)}   # rs_dgrad is not a TE knob: 0 bulk, 1 reduce-scatter dgrad
    cfg = {**KNOB_DEFAULTS, **(config or {})}
    unknown = set(cfg) - set(KNOB_DEFAULTS)
    if unknown:
        raise ValueError(f"knobs: unknown key(s) {sorted(unknown)}")
    if isinstance(cfg["groups"], str):
        if cfg["groups"] not in GROUP_SETS:
            raise ValueError(f"knobs.groups: {cfg['groups']!r} is not one of {', '.join(GROUP_SETS)} nor a list "
                             f"of groups ({', '.join(ALL_GROUPS)})")
        cfg["groups"] = list(GROUP_SETS[cfg["groups"]])
    if not isinstance(cfg["groups"], (list, tuple)) or not cfg["groups"]:
        raise ValueError(f"knobs.groups: expected proven, all or a non-empty list of groups "
                         f"({', '.join(ALL_GROUPS)}), got {cfg['groups']!r}")
    bad = [g for g in cfg["groups"] if g not in GROUP_KNOBS]
    if bad:
        raise ValueError(f"knobs.groups: unknown group(s) {bad} (expected {', '.join(GROUP_KNOBS)})")
    for k in GROUP_KNOBS:
        if k in ("method", "priority"):
            continue
        vals = cfg[k]
        if not isinstance(vals, (list, tuple)) or not vals or any(
                isinstance(v, bool) or not isinstance(v, int) or not R[k][0] <= v <= R[k][1] for v in vals):
            raise ValueError(f"knobs.{k}: expected a non-empty list of integers in [{R[k][0]}, {R[k][1]}], got {vals!r}")
    pr = cfg["priority"]
    lo, hi = R["comm_priority"]
    if (not isinstance(pr, (list, tuple)) or not pr
            or any(not isinstance(p, (list, tuple)) or len(p) != 2 or any(
                isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi for x in p) for p in pr)
            or any(tuple(p) == (0, 0) for p in pr)):
        raise ValueError(f"knobs.priority: expected [comm, gemm] pairs in [{lo}, {hi}], not [0, 0] "
                         f"(TE reads 0/0 as its default), got {pr!r}")
    return cfg


def gemm_knob_values(name: str, entry: dict, group: str, config: dict | None = None,
                     workload: str = "bf16") -> list:
    """Values of knob ``group`` TE honours for GEMM ``name`` configured as ``entry``, cheapest first;
    empty when the method does not use the knob (or it cannot matter there). Values are ints, a
    method name for "method", (comm, gemm) tuples for "priority"."""
    cfg = knob_config(config)
    m = entry["method"]
    if group == "method":
        ms = [x for x in ("ring_exchange", "pipeline") if x in allowed_methods(name)]
        return ms if len(ms) > 1 else []
    if group == "rs_dgrad":
        op, gemm = name.split("_", 1)
        if op not in COLUMN_OPS or gemm != "dgrad":
            return []
        vals = sorted(set(cfg["rs_dgrad"]))
        return vals if len(vals) > 1 or vals[0] != current_value(entry, group) else []
    if group == "priority":
        return [tuple(p) for p in cfg["priority"]]
    if group == "use_ce":
        return list(cfg["use_ce"]) if m == "ring_exchange" else []
    if group == "set_sm_margin":
        return list(cfg["set_sm_margin"])
    if group == "num_sm":
        # A copy-engine ring exchange launches signal-only kernels (userbuffers.cu: 1 block); its
        # num_sm matters only with SM copies (use_ce 0) or as the GEMM's margin (set_sm_margin 1).
        if m == "ring_exchange" and int(entry.get("use_ce", 1)) and not int(entry.get("set_sm_margin", 0)):
            return []
        return sorted(set(cfg["num_sm"]))
    if group == "cga_size":
        if m == "ring_exchange" and int(entry.get("use_ce", 1)):
            return []
        sm = int(entry.get("num_sm", METHOD_DEFAULTS_SM[m]))
        # userbuffers.cu: clusterDim = cga_size only when it divides the grid (num_sm), else 1
        return [c for c in cfg["cga_size"] if sm % c == 0]
    if group == "num_splits":
        return sorted(set(cfg["num_splits"])) if m == "pipeline" else []
    if group == "aggregate":
        return list(cfg["aggregate"]) if m == "ring_exchange" and name in _AG_RING else []
    if group == "pipeline_rs_overlap_first_gemm":
        return list(cfg["pipeline_rs_overlap_first_gemm"]) if m == "pipeline" else []
    if group == "fp8_buf":
        ok = workload == "fp8" and m == "pipeline" and name in ("proj_fprop", "fc2_fprop")
        return list(cfg["fp8_buf"]) if ok else []
    raise ValueError(f"unknown knob group {group!r}")


METHOD_DEFAULTS_SM = {"ring_exchange": 1, "pipeline": 16, "bulk": 16}


def set_knob(entry: dict, group: str, value) -> dict:
    """``entry`` with knob group ``group`` at ``value`` (a method change starts from that method's
    TE defaults, ubcfg.merge_entry; rs_dgrad 1/0 is the method ring_exchange/bulk of a column dgrad:
    the caller drops/restores its wgrad, see search.knobs)."""
    if group == "method":
        return merge_entry(entry, {"method": value})
    if group == "rs_dgrad":
        return merge_entry(entry, {"method": "ring_exchange" if value else "bulk"})
    out = dict(entry)
    if group == "priority":
        out["comm_priority"], out["gemm_priority"] = int(value[0]), int(value[1])
    else:
        out[group] = int(value)
    return out


def with_knob(cfgs: dict, name: str, group: str, value) -> dict:
    """A ub_cfgs with GEMM ``name``'s knob group at ``value`` (``cfgs`` itself where it already is).
    rs_dgrad also drops (1) or restores at TE's default (0) the GEMM's wgrad, as TE requires."""
    if value == current_value(cfgs[name], group):
        return cfgs
    out = {**cfgs, name: set_knob(cfgs[name], group, value)}
    if group == "rs_dgrad":
        wgrad = name.replace("dgrad", "wgrad")
        if value:
            out.pop(wgrad, None)
        else:
            out[wgrad] = te_default_ub_cfgs()[wgrad]
    return out


def knob_candidates(op: str, tp: int, base: dict, config: dict | None = None,
                    workload: str = "bf16") -> dict[str, dict[str, list]]:
    """Per knob group (in the configured order), per GEMM "<op>_<gemm>" of ``op``: the values TE
    honours there given ``base`` (a ten-GEMM ub_cfgs, e.g. a preset's), cheapest first. GEMMs and
    groups with nothing to choose are left out. Each value, set alone on ``base``, passes
    ubcfg.validate_ub_cfgs. Atomic GEMM is not per op (its ring_exchange pairs span qkv/proj and
    fc1/fc2): see atomic_pair_candidates."""
    cfg = knob_config(config)
    out: dict[str, dict[str, list]] = {}
    for group in cfg["groups"]:
        per = {}
        for gemm in OP_GEMMS[op]:
            name = f"{op}_{gemm}"
            vals = []
            for v in gemm_knob_values(name, base[name], group, config, workload):
                trial = with_knob(base, name, group, v)
                try:
                    validate_ub_cfgs(trial, workload=workload)
                except ValueError:
                    continue
                vals.append(v)
            if len(vals) > 1 or (vals and vals[0] != current_value(base[name], group)):
                per[name] = vals
        if per:
            out[group] = per
    return out


def current_value(entry: dict, group: str):
    """The value of knob group ``group`` in ``entry`` (TE's default where the entry omits it)."""
    if group == "method":
        return entry["method"]
    if group == "rs_dgrad":       # asked of column dgrads only: bulk, or a reduce-scatter method
        return int(entry["method"] != "bulk")
    if group == "priority":
        return (int(entry.get("comm_priority", TE_COMM_PRIORITY)), int(entry.get("gemm_priority", TE_GEMM_PRIORITY)))
    if group in entry:
        return int(entry[group])
    return int(METHOD_DEFAULTS[entry["method"]].get(group, 0))


def atomic_pair_candidates(base: dict, workload: str = "bf16") -> list[dict]:
    """Whole-block configs for TE's atomic GEMM pairs (FP8 only): ``base``, then each pair
    (qkv_fprop+proj_fprop, fc1_fprop+fc2_fprop) switched to atomic ring_exchange together, as TE
    requires. Empty under bf16. These are layer-level candidates (they span two ops)."""
    if workload != "fp8":
        return []
    out = [base]
    for ag, rs in ATOMIC_PAIRS:
        c = {**base, ag: merge_entry(base[ag], {"method": "ring_exchange", "atomic_gemm": 1}),
             rs: merge_entry(base[rs], {"method": "ring_exchange", "atomic_gemm": 1})}
        validate_ub_cfgs(c, workload=workload)
        out.append(c)
    return out


def grid_size(op: str, tp: int, base: dict, config: dict | None = None, workload: str = "bf16") -> int:
    """Size of the exhaustive grid over the same knob values for ``op``: per GEMM, summed over its
    methods, the product of every group's value count (each knob counted as if it mattered, i.e.
    num_sm/cga_size of a ring exchange as with SM copies), multiplied over the op's GEMMs; for a column
    op with the reduce-scatter dgrad in the search, plus its grid in that mode (fprop x a ring-exchange
    dgrad, no wgrad)."""
    cfg = knob_config(config)
    groups = [g for g in cfg["groups"] if g not in ("method", "rs_dgrad")]

    def gemm_grid(name: str, entry0: dict) -> int:
        methods = gemm_knob_values(name, entry0, "method", config, workload) or [entry0["method"]]
        n = 0
        for m in methods:
            entry = set_knob(entry0, "method", m) if m != entry0["method"] else dict(entry0)
            entry.update(use_ce=0, set_sm_margin=1, num_sm=1) if m == "ring_exchange" else entry.update(num_sm=1)
            k = 1
            for group in groups:
                k *= max(1, len(gemm_knob_values(name, entry, group, config, workload)))
            n += k
        return n

    total = 1
    for gemm in OP_GEMMS[op]:
        if f"{op}_{gemm}" in base:
            total *= gemm_grid(f"{op}_{gemm}", base[f"{op}_{gemm}"])
    dgrad = f"{op}_dgrad"
    if op in COLUMN_OPS and "rs_dgrad" in cfg["groups"] and 1 in cfg["rs_dgrad"] and base[dgrad]["method"] == "bulk":
        total += gemm_grid(f"{op}_fprop", base[f"{op}_fprop"]) * gemm_grid(dgrad, set_knob(base[dgrad], "rs_dgrad", 1))
    return total
