"""Megatron-core's TP overlap switches from a per-op decision (issue 12; emit.megatron_switches writes them).

Read at NVIDIA/Megatron-LM tag core_v0.19.0 (5be9626709af2722333bf54797c954c09edeada3):
megatron/core/model_parallel_config.py (ModelParallelConfig fields), megatron/training/arguments.py
(flags generated from the dataclass by ArgumentGroupFactory, megatron/training/argument_utils.py:
a bool field defaulting to False gets ``--<name>``, one defaulting to True gets ``--no-<name>`` /
``--disable-<name>``; ``tp_comm_overlap_disable_qkv/fc1`` are in the exclude list: no CLI flag;
``--tp-comm-overlap-cfg`` is added by hand; ``tp_comm_overlap`` asserts ``sequence_parallel``) and
megatron/core/extensions/transformer_engine.py (how the switches reach TE's ub_* arguments):

  switch (default)                 reaches TE as                         acts on
  tp_comm_overlap (False)          everything below only when True       all ops
  tp_comm_overlap_ag (True)        ub_overlap_ag                         qkv/fc1 fprop AG, proj/fc2 dgrad AG
  tp_comm_overlap_rs (True)        ub_overlap_rs                         proj/fc2 fprop RS
  tp_comm_bulk_dgrad (True)        ub_bulk_dgrad (off if rs_dgrad)       qkv/fc1 dgrad (bulk AG)
  tp_comm_bulk_wgrad (True)        ub_bulk_wgrad (off if rs_dgrad)       qkv/fc1 wgrad (bulk RS)
  tp_comm_overlap_rs_dgrad (False) ub_overlap_rs_dgrad                   qkv/fc1 dgrad RS (ring/pipeline)
  tp_comm_overlap_disable_qkv      qkv: ub_overlap_ag=ub_overlap_rs_dgrad=False (bulk stays!)
  tp_comm_overlap_disable_fc1      fc1: the same

So: proj and fc2 have no switch of their own (rs and ag are shared), a column op's bulk overlap is
one global pair of switches, and rs_dgrad is one switch for qkv and fc1. ``switches_for`` refuses
the decisions these switches cannot express, naming the reason. The GPU machines run the real check
(``check_megatron`` builds a megatron.core ModelParallelConfig); without megatron-core it checks the
field names against MEGATRON_FIELDS, pinned from the source above.
"""
from __future__ import annotations

from tptune.model.ops import COLUMN_OPS, OPS, ROW_OPS, TE_GEMMS
from tptune.te.ubcfg import compose_ub_cfgs, is_rs_dgrad, op_entries

MEGATRON_CORE = "core_v0.19.0 (NVIDIA/Megatron-LM@5be9626709af2722333bf54797c954c09edeada3)"
# ModelParallelConfig's TP-overlap fields at that commit, with their defaults.
MEGATRON_FIELDS = {
    "tp_comm_overlap": False, "tp_comm_bulk_wgrad": True, "tp_comm_bulk_dgrad": True,
    "tp_comm_overlap_ag": True, "tp_comm_overlap_rs": True, "tp_comm_overlap_rs_dgrad": False,
    "tp_comm_overlap_disable_qkv": False, "tp_comm_overlap_disable_fc1": False,
}
NO_CLI_FLAG = ("tp_comm_overlap_disable_qkv", "tp_comm_overlap_disable_fc1")   # arguments.py exclude list
NONE = "none"


def op_mode(op: str, setting) -> str:
    """"none", "ub" (row op), "bulk" or "rs_dgrad" (column op: how its dgrad overlaps)."""
    if setting == NONE or setting is None:
        return NONE
    if not isinstance(setting, dict):
        raise ValueError(f"{op}: expected 'none' or a ub_cfgs mapping, got {setting!r}")
    if op in ROW_OPS:
        return "ub"
    d = setting.get(f"{op}_dgrad")
    if d is None:
        raise ValueError(f"{op}: its ub_cfgs has no {op}_dgrad entry")
    return "rs_dgrad" if is_rs_dgrad(f"{op}_dgrad", d["method"]) else "bulk"


def switches_for(decision: dict) -> dict[str, bool]:
    """Megatron's eight switches for ``decision`` (op -> "none" | ub_cfgs holding that op's
    entries); ValueError with Megatron's reason when no combination of switches expresses it."""
    unknown = set(decision) - set(OPS)
    if unknown or set(OPS) - set(decision):
        raise ValueError(f"decision: expected one entry for each of {', '.join(OPS)}, got {sorted(decision)}")
    mode = {op: op_mode(op, decision[op]) for op in OPS}
    for op in COLUMN_OPS:
        d = decision[op].get(f"{op}_dgrad") if mode[op] == "rs_dgrad" else None
        if d is not None and d["method"] == "pipeline":   # te.check: pipeline_dgrad
            raise ValueError(f"{op}_dgrad: a pipelined reduce-scatter dgrad runs through TE's split_overlap_rs, "
                             f"which chunks dgrad's GEMM wrongly: silent gradient corruption (results/rs-dgrad-x2); "
                             f"only ring_exchange overlaps a qkv/fc1 dgrad reduce-scatter")
    sw = dict(MEGATRON_FIELDS)
    if all(m == NONE for m in mode.values()):
        return sw                                   # tp_comm_overlap off: plain NCCL everywhere
    sw["tp_comm_overlap"] = True
    rows = [op for op in ROW_OPS if mode[op] != NONE]
    if len(rows) == 1:
        off = next(op for op in ROW_OPS if mode[op] == NONE)
        raise ValueError(f"{off} cannot keep plain NCCL while {rows[0]} overlaps: Megatron has no switch "
                         f"of its own for proj or fc2 (tp_comm_overlap_rs and tp_comm_overlap_ag act on both)")
    cols = [op for op in COLUMN_OPS if mode[op] != NONE]
    if not rows:
        # row fprop RS off is fine; row dgrad AG off means tp_comm_overlap_ag off, which also
        # turns off qkv/fc1's fprop all-gather overlap
        if cols:
            raise ValueError(f"proj and fc2 can keep plain NCCL only with tp_comm_overlap_ag off, which also "
                             f"turns off {' and '.join(cols)} fprop's all-gather overlap (the measured "
                             f"setting); Megatron has no per-op switch for proj/fc2")
    col_modes = {mode[op] for op in cols}
    if len(col_modes) > 1:
        raise ValueError("qkv and fc1 overlap their dgrad differently (bulk vs reduce-scatter), but "
                         "tp_comm_overlap_rs_dgrad is one switch for both")
    cm = next(iter(col_modes), None)
    sw["tp_comm_overlap_rs_dgrad"] = cm == "rs_dgrad"
    for op in COLUMN_OPS:
        if mode[op] == NONE:
            sw[f"tp_comm_overlap_disable_{op}"] = True
            if cm == "bulk":
                other = next(o for o in COLUMN_OPS if o != op)
                raise ValueError(f"{op} cannot keep plain NCCL while {other} uses bulk dgrad/wgrad overlap: "
                                 f"tp_comm_overlap_disable_{op} turns off only its all-gather and "
                                 f"reduce-scatter-dgrad overlaps, and tp_comm_bulk_dgrad/wgrad are global")
    if cm != "bulk":
        # no column op uses bulk: switch bulk off so a disabled column op is really plain NCCL
        sw["tp_comm_bulk_dgrad"] = sw["tp_comm_bulk_wgrad"] = False
    return sw


def block_switches(ub_cfgs: dict) -> dict[str, bool]:
    """The switches of a block that overlaps every op with ``ub_cfgs`` (what the layer stage builds and
    what transformer_config_overrides.yaml holds for it); ValueError when Megatron cannot express it."""
    return switches_for({op: op_entries(ub_cfgs, op) for op in OPS})


def op_switches(op: str, ub_cfgs: dict) -> dict[str, bool]:
    """The switches under which Megatron builds ``op``'s layer overlapped with ``ub_cfgs``: overlap on,
    and for a column op whose dgrad is a reduce-scatter, tp_comm_overlap_rs_dgrad (else Megatron hands
    TE a bulk dgrad on a reduce-scatter communicator). The other ops' switches do not reach its layer."""
    sw = dict(MEGATRON_FIELDS, tp_comm_overlap=True)
    if op in COLUMN_OPS:
        sw["tp_comm_overlap_rs_dgrad"] = op_mode(op, op_entries(ub_cfgs, op)) == "rs_dgrad"
    return sw


def overlap_cfgs(decision: dict, base: dict, *, workload: str = "bf16") -> dict[str, dict]:
    """The ub_cfgs for ``--tp-comm-overlap-cfg``: each overlapping op's own entries over ``base``;
    a column op with a reduce-scatter dgrad drops its wgrad entry (TE refuses one then)."""
    cfgs = compose_ub_cfgs({op: s for op, s in decision.items() if s != NONE and s is not None}, base,
                           workload=workload, source="overlap cfg")
    return {k: cfgs[k] for k in TE_GEMMS if k in cfgs}


def megatron_flags(switches: dict[str, bool], cfg_path: str | None = None) -> list[str]:
    """Megatron-LM command-line flags for ``switches`` (only those differing from the defaults;
    the two switches without a CLI flag go in the TransformerConfig override file instead)."""
    check_switches(switches)
    if not switches["tp_comm_overlap"]:
        return []
    flags = ["--sequence-parallel", "--tp-comm-overlap"]
    if cfg_path:
        flags.append(f"--tp-comm-overlap-cfg {cfg_path}")  # one flag with its value a line
    for name, default in MEGATRON_FIELDS.items():
        if name == "tp_comm_overlap" or name in NO_CLI_FLAG or switches[name] == default:
            continue
        flags.append(f"--{name.replace('_', '-')}" if switches[name] else f"--no-{name.replace('_', '-')}")
    return flags


def transformer_config_overrides(switches: dict[str, bool]) -> dict:
    """TransformerConfig (ModelParallelConfig) field overrides: all eight switches, and
    sequence_parallel when overlap is on (Megatron asserts it)."""
    check_switches(switches)
    out = {k: bool(switches[k]) for k in MEGATRON_FIELDS}
    if switches["tp_comm_overlap"]:
        out = {"sequence_parallel": True, **out}
    return out


def check_switches(switches: dict) -> None:
    missing = set(MEGATRON_FIELDS) - set(switches)
    extra = set(switches) - set(MEGATRON_FIELDS)
    if missing or extra:
        raise ValueError(f"switches: expected exactly {', '.join(MEGATRON_FIELDS)} "
                         f"(missing {sorted(missing)}, unknown {sorted(extra)})")
    bad = [k for k, v in switches.items() if not isinstance(v, bool)]
    if bad:
        raise ValueError(f"switches: {bad} must be true/false")


def check_megatron(switches: dict, tp: int = 2):
    """Build a real megatron.core ModelParallelConfig with ``switches`` when megatron-core imports
    (the GPU machines) and return it; otherwise check the names against MEGATRON_FIELDS and return
    None."""
    check_switches(switches)
    try:
        from megatron.core import ModelParallelConfig
    except ImportError:
        return None
    cfg = ModelParallelConfig(tensor_model_parallel_size=tp, sequence_parallel=tp > 1, **switches)
    for k, v in switches.items():
        if getattr(cfg, k) != v:
            raise ValueError(f"ModelParallelConfig changed {k} to {getattr(cfg, k)!r}")
    return cfg
