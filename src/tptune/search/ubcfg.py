"""TE userbuffers configs (``ub_cfgs``): TE's defaults, named presets, per-case merge, validation.

A ub_cfgs dict maps each of TE's ten GEMM names ("qkv_fprop" ... "fc2_dgrad", ops.TE_GEMMS) to
``{"method": ..., <knob>: int, ...}``. Knob values are ints (booleans as 0/1), as in case ids.

TE's rules (transformer_engine/pytorch/module/base.py, initialize_ub, TE 2.x):
- qkv/fc1 dgrad and wgrad are bulk overlaps (dgrad's GEMM hides the all-gather of the input that
  wgrad needs, wgrad's GEMM hides the reduce-scatter of dgrad's output). TE can make *_dgrad a
  ring-exchange reduce-scatter instead, but then *_wgrad must be absent from ub_cfgs, which the
  ten-key config cannot express, so tptune keeps them bulk.
- qkv/fc1 fprop and proj/fc2 dgrad all-gather their input: ring_exchange only (TE refuses
  pipeline for an all-gather; bulk is not an AG/RS GEMM overlap).
- proj/fc2 fprop reduce-scatter their output: ring_exchange or pipeline.
Knobs each method actually uses (the C++ CommOverlapP2P / CommOverlapBase constructors):
ring_exchange: num_sm, cga_size, set_sm_margin, aggregate, use_ce; pipeline: num_sm, cga_size,
set_sm_margin, num_splits; bulk: num_sm, cga_size, set_sm_margin (bulk never splits the GEMM, so
TE's default num_splits=4 is dropped here).
"""
from __future__ import annotations

from pathlib import Path

import yaml

from ..cases import BOOL_KNOBS, KNOBS, Case
from ..ops import COLUMN_OPS, TE_GEMMS

MAX_SMS = 132                 # SMs of an H100/H200 SXM
KNOB_RANGES = {"num_sm": (1, MAX_SMS), "cga_size": (1, 8), "num_splits": (1, 64),
               "set_sm_margin": (0, 1), "aggregate": (0, 1), "use_ce": (0, 1)}
METHOD_KNOBS = {
    "ring_exchange": ("num_sm", "cga_size", "set_sm_margin", "aggregate", "use_ce"),
    "pipeline": ("num_sm", "cga_size", "set_sm_margin", "num_splits"),
    "bulk": ("num_sm", "cga_size", "set_sm_margin"),
}
# TE's get_default_config() values per method (bf16, no atomic GEMM).
METHOD_DEFAULTS = {
    "ring_exchange": {"num_sm": 1, "cga_size": 1, "set_sm_margin": 0, "aggregate": 0, "use_ce": 1},
    "pipeline": {"num_sm": 16, "cga_size": 2, "set_sm_margin": 1, "num_splits": 4},
    "bulk": {"num_sm": 16, "cga_size": 2, "set_sm_margin": 1},
}
PRESETS_DIR = Path(__file__).resolve().parents[3] / "config" / "presets"
BUILTIN_PRESET = "te"


def allowed_methods(name: str) -> tuple[str, ...]:
    """Overlap methods TE supports for GEMM ``name`` ("<op>_<gemm>"), TE's default first."""
    op, gemm = name.split("_", 1)
    if op in COLUMN_OPS and gemm in ("dgrad", "wgrad"):
        return ("bulk",)
    if op not in COLUMN_OPS and gemm == "fprop":       # reduce-scatter after the GEMM
        return ("pipeline", "ring_exchange")
    return ("ring_exchange",)


def te_default_ub_cfgs() -> dict[str, dict]:
    """TE's built-in config of all ten GEMMs (what initialize_ub uses when ub_cfgs is empty)."""
    return {name: {"method": allowed_methods(name)[0], **METHOD_DEFAULTS[allowed_methods(name)[0]]}
            for name in TE_GEMMS}


def merge_entry(base: dict, update: dict) -> dict:
    """``update`` applied to ``base``. Keeping the method keeps base's knobs; changing it starts
    from TE's defaults of the new method, so no knob of the old method leaks into the new one."""
    method = update.get("method", base["method"])
    start = base if method == base["method"] else METHOD_DEFAULTS[method]
    out = {"method": method}
    out.update((k, v) for k, v in start.items() if k != "method")
    out.update((k, v) for k, v in update.items() if k != "method")
    return out


def load_preset(name: str, presets_dir: str | Path | list | None = None) -> dict[str, dict]:
    """Preset ``name`` as a full, validated ten-GEMM ub_cfgs: "te" is TE's defaults; any other name
    is ``<dir>/<name>.yaml`` in ``presets_dir`` (one folder or a list: a run's own presets, such as
    its tuned combination, or a user's files for tptune verify), else config/presets (entries merged
    over TE's defaults, see merge_entry)."""
    cfgs = te_default_ub_cfgs()
    if name == BUILTIN_PRESET:
        return cfgs
    dirs = [Path(d) for d in (presets_dir if isinstance(presets_dir, (list, tuple)) else [presets_dir]) if d]
    path = next((d / f"{name}.yaml" for d in dirs + [PRESETS_DIR] if (d / f"{name}.yaml").is_file()), None)
    if path is None:
        raise ValueError(f"ub preset {name!r}: no file {name}.yaml in {', '.join(map(str, dirs + [PRESETS_DIR]))}")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"ub preset {path}: expected a mapping of GEMM name -> config")
    validate_ub_cfgs(raw, require_all=False, source=str(path))
    for key, entry in raw.items():
        cfgs[key] = merge_entry(cfgs[key], _as_ints(entry))
    validate_ub_cfgs(cfgs, source=str(path))
    return cfgs


def case_ub_cfgs(case: Case, presets_dir: str | Path | list | None = None) -> dict[str, dict]:
    """Full ub_cfgs of a ``ub.*`` case: its preset, then its GemmOverrides on "<op>_<gemm>"."""
    if case.variant.kind != "ub":
        raise ValueError(f"case {case.id}: only ub.* cases have ub_cfgs")
    cfgs = load_preset(case.variant.preset, presets_dir)
    for o in case.variant.overrides:
        key = f"{case.op}_{o.gemm}"
        cfgs[key] = merge_entry(cfgs[key], o.as_ub_cfg())
    validate_ub_cfgs(cfgs, source=f"case {case.id}")
    return cfgs


def validate_ub_cfgs(cfgs: dict, *, require_all: bool = True, source: str = "ub_cfgs") -> None:
    """Raise ValueError naming the first bad key: unknown GEMM, missing or unsupported method (see
    the module doc for TE's rules), a knob the method does not use, or a value out of range."""
    if not isinstance(cfgs, dict):
        raise ValueError(f"{source}: expected a mapping of GEMM name -> config, got {type(cfgs).__name__}")
    for key, entry in cfgs.items():
        where = f"{source}: {key}"
        if key not in TE_GEMMS:
            raise ValueError(f"{where}: unknown GEMM (expected one of {', '.join(TE_GEMMS)})")
        if not isinstance(entry, dict) or "method" not in entry:
            raise ValueError(f"{where}: expected a mapping with a 'method'")
        method = entry["method"]
        if method not in allowed_methods(key):
            raise ValueError(f"{where}: method {method!r} not supported here "
                             f"(TE allows {' or '.join(allowed_methods(key))})")
        for knob, value in entry.items():
            if knob == "method":
                continue
            if knob not in KNOB_RANGES:
                raise ValueError(f"{where}: unknown knob {knob!r} (expected one of {', '.join(KNOBS.values())})")
            if knob not in METHOD_KNOBS[method]:
                raise ValueError(f"{where}: {method} does not use {knob!r} "
                                 f"(it uses {', '.join(METHOD_KNOBS[method])})")
            lo, hi = KNOB_RANGES[knob]
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"{where}: {knob}={value!r} out of range [{lo}, {hi}]")
    if require_all:
        missing = [g for g in TE_GEMMS if g not in cfgs]
        if missing:
            raise ValueError(f"{source}: missing GEMM(s) {', '.join(missing)}")


def _as_ints(entry: dict) -> dict:
    return {k: int(v) if k in BOOL_KNOBS and isinstance(v, bool) else v for k, v in entry.items()}


def compose_ub_cfgs(per_op: dict[str, dict], base: dict | None = None) -> dict[str, dict]:
    """One ten-GEMM ub_cfgs from per-op choices: op X's GEMMs ("X_*") come from ``per_op[X]``
    (a full or partial ub_cfgs, e.g. the winning case's), the rest from ``base`` (TE's defaults)."""
    cfgs = {k: dict(v) for k, v in (base or te_default_ub_cfgs()).items()}
    for op, op_cfgs in per_op.items():
        own = {k: v for k, v in op_cfgs.items() if k.split("_", 1)[0] == op}
        if not own:
            raise ValueError(f"compose_ub_cfgs: no {op}_* entries in the config given for {op}")
        cfgs.update((k, dict(v)) for k, v in own.items())
    validate_ub_cfgs(cfgs, source="composed ub_cfgs")
    return cfgs
