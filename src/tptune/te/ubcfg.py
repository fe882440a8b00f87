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

Every knob TE 2.20's initialize_ub takes, and where TE honours it. Read at NVIDIA/TransformerEngine
@d0067d0da6cb01811b8072a7d304f0e00344ce2b (2.20.0.dev0): transformer_engine/pytorch/module/base.py
(initialize_ub: get_default_config, add_ub, the user-config loop) and
transformer_engine/common/comm_gemm_overlap/comm_gemm_overlap.cpp (CommOverlapCore::initialize,
CommOverlapBase / CommOverlapP2PBase constructors), userbuffers/userbuffers.cu (launch macros).
  knob              methods               TE's rule (tptune: refused otherwise, with this reason)
  num_sm            all                   comm kernels' grid; GEMM SMs = SMs - num_sm if set_sm_margin
  cga_size          all                   cluster size of the comm kernels (1..8); userbuffers.cu
                                          falls back to 1 when it does not divide num_sm
  set_sm_margin     all                   0/1
  num_splits        pipeline              ring_exchange: CommOverlapP2P takes tp_size splits, never
                                          the knob; bulk never splits
  aggregate         ring_exchange         read in split_overlap_ag only (an RS ring ignores it)
  use_ce            ring_exchange         CommOverlapBase passes use_ce=false (pipeline, bulk)
  atomic_gemm       ring_exchange, pipe   FP8 only (add_ub: "Atomic GEMM overlap supported only for
                                          FP8 GEMM"); bulk resets it to False; a ring_exchange
                                          atomic qkv_fprop/fc1_fprop needs proj_fprop/fc2_fprop
                                          atomic ring_exchange too, and the other way round
  fp8_buf           see FP8 rules         only under FP8; honoured at proj_fprop/fc2_fprop (and a
                                          column dgrad moved to pipeline); TE forces True on the
                                          all-gather GEMMs and False on the bulk wgrads
  comm_priority,    all                   CUDA stream priorities in [-5, 0] on H100/H200 (TE defaults
  gemm_priority                           comm -5, GEMM 0); both 0 means "the device's range" in C++
  pipeline_rs_overlap_first_gemm  pipeline  read in CommOverlapBase::split_overlap_rs only
  is_reduce_scatter  -                    set by TE from the GEMM; accepted only at TE's own value
Column dgrad (qkv_dgrad, fc1_dgrad) may be a ring_exchange/pipeline reduce-scatter instead of bulk
(Megatron's tp_comm_overlap_rs_dgrad) only when its *_wgrad is absent from ub_cfgs (TE raises
"Cannot specify user UB config for '<wgrad>' when its corresponding dgrad ... uses a non-bulk
overlap method").
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from tptune.cases import BOOL_KNOBS, KNOBS, Case
from tptune.model.ops import COLUMN_OPS, TE_GEMMS

MAX_SMS = 132                 # SMs of an H100/H200 SXM
# cudaDeviceGetStreamPriorityRange on H100/H200 (CUDA 12): greatest -5, least 0. CUDA clamps values
# outside; tptune refuses them instead of letting them be clamped silently.
STREAM_PRIORITY_RANGE = (-5, 0)
TE_COMM_PRIORITY, TE_GEMM_PRIORITY = -5, 0   # get_default_config: _MAX_STREAM_PRIORITY, _MIN_STREAM_PRIORITY
KNOB_RANGES = {"num_sm": (1, MAX_SMS), "cga_size": (1, 8), "num_splits": (1, 64),
               "set_sm_margin": (0, 1), "aggregate": (0, 1), "use_ce": (0, 1),
               "atomic_gemm": (0, 1), "fp8_buf": (0, 1), "pipeline_rs_overlap_first_gemm": (0, 1),
               "comm_priority": STREAM_PRIORITY_RANGE, "gemm_priority": STREAM_PRIORITY_RANGE}
# Knobs each method's C++ object reads (fp8_buf is a per-GEMM rule, see _check_fp8_buf).
METHOD_KNOBS = {
    "ring_exchange": ("num_sm", "cga_size", "set_sm_margin", "aggregate", "use_ce", "atomic_gemm",
                      "comm_priority", "gemm_priority"),
    "pipeline": ("num_sm", "cga_size", "set_sm_margin", "num_splits", "atomic_gemm", "fp8_buf",
                 "comm_priority", "gemm_priority", "pipeline_rs_overlap_first_gemm"),
    "bulk": ("num_sm", "cga_size", "set_sm_margin", "comm_priority", "gemm_priority"),
}
FP8_KNOBS = ("atomic_gemm", "fp8_buf")
WORKLOADS = ("bf16", "fp8")
# Why a method does not take a knob, citing TE (ValueError text for the refusals).
_NOT_USED_WHY = {
    ("ring_exchange", "num_splits"): "CommOverlapP2P always splits into tp_size chunks",
    ("ring_exchange", "pipeline_rs_overlap_first_gemm"): "only CommOverlapBase::split_overlap_rs reads it",
    ("bulk", "pipeline_rs_overlap_first_gemm"): "only CommOverlapBase::split_overlap_rs reads it",
    ("bulk", "num_splits"): "bulk_overlap never splits the GEMM",
    ("bulk", "use_ce"): "CommOverlapBase is built with use_ce=false",
    ("pipeline", "use_ce"): "CommOverlapBase is built with use_ce=false",
    ("bulk", "aggregate"): "only CommOverlapP2PBase::split_overlap_ag reads it",
    ("pipeline", "aggregate"): "only CommOverlapP2PBase::split_overlap_ag reads it",
    ("bulk", "atomic_gemm"): "TE add_ub: 'atomic GEMM not is supported for a bulk overlap', reset to False",
    ("bulk", "fp8_buf"): "TE forces fp8_buf for the bulk GEMMs (True on dgrad's all-gather, False on wgrad's reduce-scatter)",
    ("ring_exchange", "fp8_buf"): "TE honours fp8_buf only at proj_fprop/fc2_fprop and pipelined GEMMs",
}
# TE's atomic GEMM + ring_exchange pairs of one TP block (base.py ag_rs_pairs).
ATOMIC_PAIRS = (("qkv_fprop", "proj_fprop"), ("fc1_fprop", "fc2_fprop"))
# GEMMs whose buffer TE makes FP8 whatever the config says (base.py layers_all_gather_overlap), and
# the bulk reduce-scatters it never makes FP8.
FP8_BUF_FORCED = {"qkv_fprop": 1, "qkv_dgrad": 1, "proj_dgrad": 1, "fc1_fprop": 1, "fc1_dgrad": 1,
                  "fc2_dgrad": 1, "qkv_wgrad": 0, "fc1_wgrad": 0}
REDUCE_SCATTER_GEMMS = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")   # TE's default roles
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


# A preset file may start from another preset (``base: nemo_tp4``) and name the environment its
# training recipe runs with (``environment:``), so a reference can be measured as NVIDIA runs it.
# Only variables TE reads when a layer is built can differ between the settings of one session (each
# case rebuilds its layer): the layernorm SM margins, read by LayerNormLinear / LayerNormMLP in their
# constructors (TE 2.20.2 module/layernorm_linear.py, module/layernorm_mlp.py). Variables read once per
# process, such as CUDA_DEVICE_MAX_CONNECTIONS (every worker runs with 1, measure.envinfo), are refused.
PRESET_KEYS = ("base", "environment")
CASE_ENVIRONMENT = {"NVTE_FWD_LAYERNORM_SM_MARGIN": "SMs kept free of the forward layernorm kernel",
                    "NVTE_BWD_LAYERNORM_SM_MARGIN": "SMs kept free of the backward layernorm kernel"}


def _preset_file(name: str, presets_dir) -> Path:
    dirs = [Path(d) for d in (presets_dir if isinstance(presets_dir, (list, tuple)) else [presets_dir]) if d]
    path = next((d / f"{name}.yaml" for d in dirs + [PRESETS_DIR] if (d / f"{name}.yaml").is_file()), None)
    if path is None:
        raise ValueError(f"ub preset {name!r}: no file {name}.yaml in {', '.join(map(str, dirs + [PRESETS_DIR]))}")
    return path


def _resolve_preset(name: str, presets_dir, seen: tuple = ()) -> tuple[dict[str, dict], dict[str, str]]:
    """(full validated ub_cfgs, environment) of preset ``name``: its file's entries merged over its base's
    ub_cfgs (TE's defaults without a base), its environment over its base's."""
    if name == BUILTIN_PRESET:
        return te_default_ub_cfgs(), {}
    if name in seen:
        raise ValueError(f"ub preset {name!r}: its base chain loops ({' -> '.join(seen + (name,))})")
    path = _preset_file(name, presets_dir)
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"ub preset {path}: expected a mapping of GEMM name -> config")
    return _resolve_raw(raw, path, presets_dir, seen + (name,))


def is_preset_format(raw) -> bool:
    """Whether a parsed ub_cfgs file is in tptune's preset format (a ``base`` or an ``environment`` beside
    the GEMM entries), which Megatron-LM's --tp-comm-overlap-cfg does not have."""
    return isinstance(raw, dict) and any(k in raw for k in PRESET_KEYS)


def resolve_preset_mapping(raw: dict, path: str | Path) -> tuple[dict[str, dict], dict[str, str]]:
    """(full validated ub_cfgs, environment) of a preset file's parsed contents ``raw`` (read from ``path``):
    its base is looked up beside it, then in config/presets. ValueError naming what is wrong."""
    path = Path(path)
    return _resolve_raw(raw, path, [path.parent], (path.stem,))


def _resolve_raw(raw: dict, path: Path, presets_dir, seen: tuple) -> tuple[dict[str, dict], dict[str, str]]:
    base = raw.get("base", BUILTIN_PRESET)
    if not isinstance(base, str) or not base:
        raise ValueError(f"ub preset {path}: base: expected the name of another preset, got {base!r}")
    base_cfgs, env = _resolve_preset(base, presets_dir, seen)
    given = raw.get("environment") or {}
    if not isinstance(given, dict):
        raise ValueError(f"ub preset {path}: environment: expected a mapping of variable -> value")
    for var, value in given.items():
        if var not in CASE_ENVIRONMENT:
            raise ValueError(f"ub preset {path}: environment: {var} cannot differ between the settings of one "
                             f"session (TE reads it once per process, or not at all); allowed: "
                             f"{', '.join(sorted(CASE_ENVIRONMENT))}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"ub preset {path}: environment: {var}: expected a whole number >= 0, got {value!r}")
    entries = {k: v for k, v in raw.items() if k not in PRESET_KEYS}
    return _merged(base_cfgs, entries, str(path)), {**env, **{k: str(v) for k, v in given.items()}}


def _merged(base: dict, entries: dict, source: str) -> dict[str, dict]:
    cfgs = dict(base)
    validate_ub_cfgs(entries, require_all=False, source=source)
    for key, entry in entries.items():   # a base whose dgrad reduce-scatters has no wgrad entry: TE's default
        cfgs[key] = merge_entry(cfgs.get(key) or te_default_ub_cfgs()[key], _as_ints(entry))
    _drop_default_wgrads(cfgs, given=entries)
    validate_ub_cfgs(cfgs, source=source)
    return cfgs


def load_preset(name: str, presets_dir: str | Path | list | None = None) -> dict[str, dict]:
    """Preset ``name`` as a full, validated ten-GEMM ub_cfgs: "te" is TE's defaults; any other name
    is ``<dir>/<name>.yaml`` in ``presets_dir`` (one folder or a list: a run's own presets, such as
    its tuned combination, or a user's files for tptune verify), else config/presets (entries merged
    over TE's defaults, or over the preset the file names as its ``base``, see merge_entry)."""
    return _resolve_preset(name, presets_dir)[0]


def preset_environment(name: str, presets_dir: str | Path | list | None = None) -> dict[str, str]:
    """The environment preset ``name`` is measured with (its ``environment:``, over its base's); {} for
    most presets. The worker sets it while it builds a case of this preset."""
    return _resolve_preset(name, presets_dir)[1]


def _drop_default_wgrads(cfgs: dict, given) -> None:
    """TE's initialize_ub: a qkv/fc1 dgrad given a reduce-scatter method takes its wgrad out of the
    bulk overlaps, so the default wgrad entry goes; one the user gave stays and is refused by
    validate_ub_cfgs, with TE's reason."""
    for op in COLUMN_OPS:
        if is_rs_dgrad(f"{op}_dgrad", cfgs[f"{op}_dgrad"]["method"]) and f"{op}_wgrad" not in given:
            cfgs.pop(f"{op}_wgrad", None)


def case_ub_cfgs(case: Case, presets_dir: str | Path | list | None = None, *,
                 workload: str = "bf16") -> dict[str, dict]:
    """Full ub_cfgs of a ``ub.*`` case: its preset, then its GemmOverrides on "<op>_<gemm>"
    (validated for ``workload``: "fp8" admits atomic_gemm/fp8_buf where TE honours them)."""
    if case.variant.kind != "ub":
        raise ValueError(f"case {case.id}: only ub.* cases have ub_cfgs")
    cfgs = load_preset(case.variant.preset, presets_dir)
    given = set()
    for o in case.variant.overrides:
        key = f"{case.op}_{o.gemm}"
        if key not in cfgs:
            raise ValueError(f"case {case.id}: {key} has no overlap here: its dgrad is a reduce-scatter "
                             f"(TE then drops the wgrad's bulk overlap)")
        cfgs[key] = merge_entry(cfgs[key], o.as_ub_cfg())
        given.add(key)
    _drop_default_wgrads(cfgs, given)
    validate_ub_cfgs(cfgs, source=f"case {case.id}", workload=workload)
    return cfgs


def op_entries(cfgs: dict, op: str) -> dict[str, dict]:
    """The ``<op>_*`` entries (one op's GEMMs) of a ub_cfgs."""
    return {k: v for k, v in cfgs.items() if k.startswith(op + "_")}


def validate_ub_cfgs(cfgs: dict, *, require_all: bool = True, source: str = "ub_cfgs",
                     workload: str = "bf16") -> None:
    """Raise ValueError naming the first bad key: unknown GEMM, missing or unsupported method (see
    the module doc for TE's rules), a knob the method does not use, a value out of range, or what
    TE refuses or silently overrides (atomic GEMM pairs, fp8_buf, stream priorities, a column
    dgrad reduce-scatter beside its wgrad). ``workload`` "fp8" admits atomic_gemm/fp8_buf where TE
    honours them; under "bf16" (the default) they may only be 0."""
    if not isinstance(cfgs, dict):
        raise ValueError(f"{source}: expected a mapping of GEMM name -> config, got {type(cfgs).__name__}")
    if workload not in WORKLOADS:
        raise ValueError(f"{source}: workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    for key, entry in cfgs.items():
        where = f"{source}: {key}"
        if key in ("proj_wgrad", "fc2_wgrad"):
            raise ValueError(f"{where}: TE 2.20 sets this GEMM up itself ('external' overlap beside "
                             f"{key.replace('wgrad', 'dgrad')}'s ring_exchange); tptune does not tune it: leave it out")
        if key not in TE_GEMMS:
            raise ValueError(f"{where}: unknown GEMM (expected one of {', '.join(TE_GEMMS)})")
        if not isinstance(entry, dict) or "method" not in entry:
            raise ValueError(f"{where}: expected a mapping with a 'method'")
        method = entry["method"]
        rs_dgrad = is_rs_dgrad(key, method)
        if rs_dgrad:
            # base.py initialize_ub: a non-bulk qkv/fc1 dgrad becomes a reduce-scatter overlap and its
            # wgrad communicator is dropped ("Cannot specify user UB config for '<wgrad>' ...").
            wgrad = key.replace("dgrad", "wgrad")
            if wgrad in cfgs:
                raise ValueError(f"{where}: method {method!r} makes {key} a reduce-scatter overlap "
                                 f"(Megatron's tp_comm_overlap_rs_dgrad), and then TE refuses a config "
                                 f"for {wgrad} ('Cannot specify user UB config for {wgrad!r} when its "
                                 f"corresponding dgrad {key!r} uses a non-bulk overlap method'); "
                                 f"TE allows bulk here otherwise")
        elif method not in allowed_methods(key):
            raise ValueError(f"{where}: method {method!r} not supported here "
                             f"(TE allows {' or '.join(allowed_methods(key))})")
        for knob, value in entry.items():
            if knob == "method":
                continue
            if knob == "is_reduce_scatter":      # get_default_config sets it from the GEMM's role
                expected = key in REDUCE_SCATTER_GEMMS or rs_dgrad
                if value not in (0, 1) or bool(value) != expected:
                    raise ValueError(f"{where}: is_reduce_scatter={value!r}, but TE sets it to {expected} "
                                     f"for this GEMM; leave it out")
                continue
            if knob not in KNOB_RANGES:
                raise ValueError(f"{where}: unknown knob {knob!r} (expected one of {', '.join(KNOBS.values())})")
            lo, hi = KNOB_RANGES[knob]
            if isinstance(value, bool):
                value = int(value)
            if not isinstance(value, int) or not lo <= value <= hi:
                if knob in METHOD_KNOBS[method] or knob == "fp8_buf":
                    raise ValueError(f"{where}: {knob}={value!r} out of range [{lo}, {hi}]")
            if knob in FP8_KNOBS:
                _check_fp8_knob(where, key, method, knob, value, workload, rs_dgrad)
                continue
            if knob not in METHOD_KNOBS[method]:
                why = _NOT_USED_WHY.get((method, knob))
                raise ValueError(f"{where}: {method} does not use {knob!r} "
                                 f"({'TE: ' + why + '; ' if why else ''}it uses {', '.join(METHOD_KNOBS[method])})")
        comm = _as_int(entry.get("comm_priority", TE_COMM_PRIORITY))
        gemm = _as_int(entry.get("gemm_priority", TE_GEMM_PRIORITY))
        if ("comm_priority" in entry or "gemm_priority" in entry) and comm == 0 and gemm == 0:
            # CommOverlapCore::initialize: gemm_priority == 0 && comm_priority == 0 -> device range
            raise ValueError(f"{where}: comm_priority=0 with gemm_priority=0 is read by TE as 'use the "
                             f"device's range' (comm {TE_COMM_PRIORITY}, GEMM {TE_GEMM_PRIORITY}: "
                             f"CommOverlapCore::initialize), not as equal priorities; leave them out")
    _check_atomic_pairs(cfgs, source, require_all)
    if require_all:
        missing = [g for g in TE_GEMMS if g not in cfgs
                   and not (g.endswith("_wgrad") and is_rs_dgrad(g.replace("wgrad", "dgrad"),
                                                                   (cfgs.get(g.replace("wgrad", "dgrad")) or {}).get("method")))]
        if missing:
            raise ValueError(f"{source}: missing GEMM(s) {', '.join(missing)}")


def _as_int(v) -> int:
    return int(v) if isinstance(v, (bool, int)) else v


def is_rs_dgrad(key: str, method) -> bool:
    """A qkv/fc1 dgrad given a reduce-scatter method (TE's dgrad_reduce_scatter_overlap)."""
    op, gemm = key.split("_", 1)
    return op in COLUMN_OPS and gemm == "dgrad" and method in ("ring_exchange", "pipeline")


def _check_fp8_knob(where, key, method, knob, value, workload, rs_dgrad) -> None:
    """atomic_gemm / fp8_buf: TE's rules (base.py add_ub and the user-config loop)."""
    if workload != "fp8":
        if value:
            what = ("TE add_ub: 'Atomic GEMM overlap supported only for FP8 GEMM'" if knob == "atomic_gemm"
                    else "TE allocates an FP8 (uint8) buffer only under FP8 quantization")
            raise ValueError(f"{where}: {knob}={value} needs an FP8 workload ({what}); this one is {workload}")
        return
    if knob == "atomic_gemm":
        if method == "bulk" and value:
            raise ValueError(f"{where}: bulk does not use 'atomic_gemm' (TE: {_NOT_USED_WHY[('bulk', 'atomic_gemm')]})")
        return
    # fp8_buf: base.py sets ub_cfg["fp8_buf"] = (name in layers_all_gather_overlap) or
    # (user fp8_buf and name in methods["pipeline"]) -- proj_fprop/fc2_fprop, or a dgrad moved there.
    if key in FP8_BUF_FORCED and not rs_dgrad:
        forced = FP8_BUF_FORCED[key]
        if value != forced:
            raise ValueError(f"{where}: TE forces fp8_buf={bool(forced)} for this GEMM "
                             f"({'an all-gather overlap' if forced else 'a bulk reduce-scatter'}), whatever "
                             f"the config says; leave it out")
        return
    if rs_dgrad and method != "pipeline" and value:
        raise ValueError(f"{where}: TE honours fp8_buf on a reduce-scatter dgrad only with method pipeline")


def _atomic_ring(entry: dict | None) -> bool:
    return bool(entry) and entry.get("method") == "ring_exchange" and bool(entry.get("atomic_gemm", 0))


def _check_atomic_pairs(cfgs: dict, source: str, require_all: bool) -> None:
    """base.py add_ub: atomic AG-GEMM with ring_exchange shuffles the chunk outputs and the paired
    RS-GEMM un-shuffles them, so qkv_fprop<->proj_fprop and fc1_fprop<->fc2_fprop must both use
    atomic GEMM + ring_exchange, or neither. Checked when both are given (always with require_all)."""
    for ag, rs in ATOMIC_PAIRS:
        if not require_all and not (ag in cfgs and rs in cfgs):
            continue
        a, r = _atomic_ring(cfgs.get(ag)), _atomic_ring(cfgs.get(rs))
        if a != r:
            on, off = (ag, rs) if a else (rs, ag)
            raise ValueError(f"{source}: {on} uses atomic GEMM with ring_exchange but {off} does not; "
                             f"TE requires the pair {ag}/{rs} to use the same overlap config (atomic "
                             f"ring_exchange AG-GEMM shuffles chunk outputs that the RS-GEMM un-shuffles)")


def _as_ints(entry: dict) -> dict:
    return {k: int(v) if k in BOOL_KNOBS and isinstance(v, bool) else v for k, v in entry.items()}


def compose_ub_cfgs(per_op: dict[str, dict], base: dict | None = None, *, workload: str = "bf16",
                    source: str = "composed ub_cfgs") -> dict[str, dict]:
    """One ten-GEMM ub_cfgs from per-op choices: op X's GEMMs ("X_*") come from ``per_op[X]``
    (a full or partial ub_cfgs, e.g. the winning case's), the rest from ``base`` (TE's defaults)."""
    cfgs = {k: dict(v) for k, v in (base or te_default_ub_cfgs()).items()}
    given = set()
    for op, op_cfgs in per_op.items():
        own = {k: v for k, v in op_cfgs.items() if k.split("_", 1)[0] == op}
        if not own:
            raise ValueError(f"compose_ub_cfgs: no {op}_* entries in the config given for {op}")
        cfgs.update((k, dict(v)) for k, v in own.items())
        given.update(own)
    _drop_default_wgrads(cfgs, given)
    validate_ub_cfgs(cfgs, source=source, workload=workload)
    return cfgs


def distinct_settings(cases: list[Case], workload: str = "bf16") -> list[Case]:
    """Cases in order, dropping any whose effective setting an earlier one already has (e.g.
    ub.te+dgrad.ring for fc2 is TE's default fc2_dgrad: the same ub_cfgs as ub.te)."""
    seen, out = set(), []
    for c in cases:
        if c.variant.kind == "ub":
            cfg = case_ub_cfgs(c, workload=workload)
            key = json.dumps(op_entries(cfg, c.op), sort_keys=True)
        else:
            key = c.variant_id
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out
