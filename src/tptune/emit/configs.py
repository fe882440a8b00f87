"""Writers of the tuner's outputs: Megatron/TE overlap config, ub_cfgs JSON, the Megatron-Bridge /
NeMo 2 overlap module, the torch backend's per-shape chunk map (seed 004 style) and decisions.json."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from tptune import __version__
from tptune.cases import BOOL_KNOBS
from tptune.model.ops import TE_GEMMS
from tptune.records.files import write_text_atomic
from tptune.records.measured_point import json_default
from tptune.te.megatron_flags import transformer_config_overrides
from tptune.te.ubcfg import METHOD_DEFAULTS, METHOD_KNOBS, validate_ub_cfgs


def te_ub_cfgs(per_gemm: dict, workload: str = "bf16") -> dict[str, dict]:
    """Validated ten-GEMM ub_cfgs in TE's types and order: method first, then only the knobs the
    method uses, booleans as true/false (``workload`` "fp8" admits TE's FP8 knobs where it honours them)."""
    validate_ub_cfgs(per_gemm, workload=workload)
    out = {}
    for name in TE_GEMMS:
        if name not in per_gemm:      # a wgrad whose dgrad is a reduce-scatter (validated above)
            continue
        entry = per_gemm[name]
        out[name] = {"method": entry["method"]}
        for knob in METHOD_KNOBS[entry["method"]]:
            if knob in entry:
                out[name][knob] = _te_type(knob, entry[knob])
    return out


def _te_type(knob: str, value):
    """A knob's value in TE's type: booleans true/false, the rest int."""
    return bool(value) if knob in BOOL_KNOBS else int(value)


def _tuned_for(model: str | None, workload: str | Mapping | None, tp: int | None = None) -> str:
    """What a written file was tuned for, for its header: model, workload (k=v ...) and TP where given."""
    if isinstance(workload, Mapping):
        workload = " ".join(f"{k}={v}" for k, v in workload.items())
    tuned = ", ".join(f"{k} {v}" for k, v in (("model", model), ("workload", workload), ("TP", tp)) if v is not None)
    return tuned or "unspecified"


def write_tp_comm_overlap_cfg(path: str | Path, per_gemm: dict, *, model: str | None = None,
                              workload: str | Mapping | None = None, tp: int | None = None,
                              notes: Iterable[str] = (), fp8: bool = False) -> Path:
    """YAML for Megatron-LM's ``--tp-comm-overlap-cfg`` (yaml.safe_load -> TE initialize_ub
    ub_cfgs): the ten GEMM entries, one flow mapping a line, under a header naming what it was
    tuned for."""
    cfgs = te_ub_cfgs(per_gemm, "fp8" if fp8 else "bf16")
    header = [f"TP comm/GEMM overlap config (Transformer Engine ub_cfgs), written by tptune {__version__}",
              "Use: Megatron-LM --tp-comm-overlap --tp-comm-overlap-cfg <this file>",
              f"Tuned for: {_tuned_for(model, workload, tp)}", *notes]
    body = yaml.safe_dump(cfgs, default_flow_style=None, sort_keys=False, width=10_000)
    path = Path(path)
    write_text_atomic(path, "".join(f"# {line}\n" for line in header) + body)
    return path


def write_ub_cfgs_json(path: str | Path, per_gemm: dict, fp8: bool = False) -> Path:
    """The same ten-GEMM ub_cfgs as JSON, ready for ``initialize_ub(ub_cfgs=json.load(f))``."""
    path = Path(path)
    write_text_atomic(path, json.dumps(te_ub_cfgs(per_gemm, "fp8" if fp8 else "bf16"), indent=2) + "\n")
    return path


BRIDGE_FILE = "tp_overlap_cfg_nemo.py"   # written beside tp_comm_overlap_cfg.yaml (decide)
# Megatron-Bridge (megatron/bridge/training/comm_overlap.py) and NeMo 2
# (nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py) hold a layer's ub_cfgs as a
# TransformerLayerTPOverlapCfg of ten GEMM fields, each a RingExchangeOverlapCfg, PipelineOverlapCfg,
# BulkOverlapCfg or None, and hand TE ``asdict`` of it (Bridge drops the None entries first). Their
# dataclasses lack fields for some of TE's knobs (use_ce, the stream priorities; NeMo 2 also cga_size on
# a ring exchange), and PipelineOverlapCfg's fp8_buf defaults to the tuple (False,), which TE reads
# as true: the module below sets every knob explicitly and adds a field where the class has none.
BRIDGE_CLASSES = {"ring_exchange": "RingExchangeOverlapCfg", "pipeline": "PipelineOverlapCfg",
                  "bulk": "BulkOverlapCfg"}
_BRIDGE_PRELUDE = '''
from dataclasses import asdict, dataclass, field, fields, make_dataclass

try:                                            # Megatron-Bridge
    from megatron.bridge.training.comm_overlap import (BulkOverlapCfg, PipelineOverlapCfg,
                                                       RingExchangeOverlapCfg, TransformerLayerTPOverlapCfg)
except ImportError:
    try:                                        # NeMo 2
        from nemo.collections.llm.recipes.tp_overlap_configs.userbuffers import (
            BulkOverlapCfg, PipelineOverlapCfg, RingExchangeOverlapCfg, TransformerLayerTPOverlapCfg)
    except ImportError:                         # neither: stand-ins, enough for ub_cfgs() and TE
        @dataclass
        class RingExchangeOverlapCfg:
            method: str = "ring_exchange"

        @dataclass
        class PipelineOverlapCfg:
            method: str = "pipeline"

        @dataclass
        class BulkOverlapCfg:
            method: str = "bulk"

        TransformerLayerTPOverlapCfg = make_dataclass("TransformerLayerTPOverlapCfg", [
            "qkv_dgrad", "qkv_wgrad", "fc1_dgrad", "fc1_wgrad", "qkv_fprop",
            "proj_dgrad", "fc1_fprop", "fc2_dgrad", "proj_fprop", "fc2_fprop"])


def _overlap(base, **knobs):
    """``base`` holding every knob given; a knob ``base`` has no field for becomes a field of a
    subclass defined in this module (asdict, which Bridge and NeMo hand to TE, keeps it)."""
    extra = tuple(k for k in knobs if k not in {f.name for f in fields(base)})
    if not extra:
        return base(**knobs)
    name = "_".join((base.__name__, "with", *extra))
    if name not in globals():
        cls = make_dataclass(name, [(k, type(knobs[k]), field(default=knobs[k])) for k in extra],
                             bases=(base,))
        cls.__module__ = __name__
        globals()[name] = cls
    return globals()[name](**knobs)
'''
_BRIDGE_TAIL = '''

def ub_cfgs() -> dict:
    """The ub_cfgs TE's initialize_ub receives from Megatron-Bridge: asdict, None entries left out."""
    return {name: cfg for name, cfg in asdict(tp_overlap_cfg).items() if cfg is not None}
'''


def bridge_overlap_source(per_gemm: dict, switches: Mapping[str, bool] | None = None, *, fp8: bool = False,
                          header: Iterable[str] = ()) -> str:
    """Python source of a module for Megatron-Bridge / NeMo 2: ``tp_overlap_cfg`` (their
    TransformerLayerTPOverlapCfg of the validated ub_cfgs, None for a wgrad TE takes no entry for),
    ``model_overrides`` (the TransformerConfig fields the overlap needs: ``switches`` as
    megatron_flags.transformer_config_overrides writes them) and ``ub_cfgs()``. Every knob is explicit:
    TE's default for the method where the config leaves it out, fp8_buf on a pipeline GEMM."""
    cfgs = te_ub_cfgs(per_gemm, "fp8" if fp8 else "bf16")
    lines = []
    for name in TE_GEMMS:
        if name not in cfgs:
            lines.append(f"    {name}=None,   # reduce-scatter dgrad: TE takes no {name} entry")
            continue
        method = cfgs[name]["method"]
        knobs = {k: _te_type(k, v) for k, v in METHOD_DEFAULTS[method].items()}
        knobs.update((k, v) for k, v in cfgs[name].items() if k != "method")
        if method == "pipeline":
            knobs.setdefault("fp8_buf", False)
        args = ", ".join(f"{k}={v!r}" for k, v in knobs.items())
        lines.append(f"    {name}=_overlap({BRIDGE_CLASSES[method]}, {args}),")
    overrides = transformer_config_overrides(dict(switches)) if switches is not None else {}
    doc = [f'"""{line}' if i == 0 else line for i, line in enumerate(_BRIDGE_USAGE.splitlines())] + ['"""']
    return ("".join(f"# {line}\n" for line in header) + "\n".join(doc) + "\n" + _BRIDGE_PRELUDE
            + "\n\ntp_overlap_cfg = TransformerLayerTPOverlapCfg(\n" + "\n".join(lines) + "\n)\n\n"
            + "# TransformerConfig (GPTModelProvider / NeMo GPTConfig) fields the overlap needs\n"
            + "model_overrides = {\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in overrides.items()) + "}\n"
            + _BRIDGE_TAIL)


_BRIDGE_USAGE = """TP comm/GEMM overlap chosen by tptune, for Megatron-Bridge and NeMo 2.

Megatron-Bridge (a ConfigContainer ``cfg``):
    from megatron.bridge.training.comm_overlap import CommOverlapConfig
    import tp_overlap_cfg_nemo as tuned
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=True, tp_comm_overlap_cfg=tuned.tp_overlap_cfg)
    for k, v in tuned.model_overrides.items():
        setattr(cfg.model, k, v)
NeMo 2 (a recipe): the same overrides on ``recipe.model.config``, and the callback
    MegatronCommOverlapCallback(tp_comm_overlap=True, tp_comm_overlap_cfg=tuned.tp_overlap_cfg)
(nemo.lightning.pytorch.callbacks.megatron_comm_overlap). Check that your NeMo drops None entries
before TE (Bridge does) when a wgrad below is None.
Transformer Engine alone: initialize_ub(..., ub_cfgs=tuned.ub_cfgs())."""


def write_bridge_overlap_py(path: str | Path, per_gemm: dict, switches: Mapping[str, bool] | None = None, *,
                            model: str | None = None, workload: str | Mapping | None = None,
                            fp8: bool = False, notes: Iterable[str] = ()) -> Path:
    """tp_overlap_cfg_nemo.py (bridge_overlap_source) under a header naming what it was tuned for."""
    header = [f"Written by tptune {__version__}; tuned for: {_tuned_for(model, workload)}", *notes]
    path = Path(path)
    write_text_atomic(path, bridge_overlap_source(per_gemm, switches, fp8=fp8, header=header))
    return path


def write_chunked_cfg(path: str | Path, shape_map: dict, notes: Iterable[str] = ()) -> Path:
    """cc_cfg.yaml-style file holding a chunked_shape_map (shape keys quoted, as seed 004 requires)."""
    path = Path(path)
    body = yaml.safe_dump(shape_map, sort_keys=False, default_style=None, width=10_000)
    write_text_atomic(path, "".join(f"# {line}\n" for line in notes) + body)
    return path


def write_decisions_json(path: str | Path, records: Iterable[dict], meta: Mapping | None = None) -> Path:
    """decisions.json: {"meta": ..., "ops": {op: record}} (no NaN/inf: failed times are null)."""
    path = Path(path)
    doc = {"meta": dict(meta or {}), "ops": {r["op"]: r for r in records}}
    write_text_atomic(path, json.dumps(doc, indent=2, allow_nan=False, default=json_default) + "\n")
    return path
