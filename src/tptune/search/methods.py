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

from dataclasses import dataclass

from ..cases import METHODS, Case, GemmOverride, Variant, make_case, make_override
from ..ops import OP_GEMMS
from .ubcfg import KNOB_RANGES, allowed_methods

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
